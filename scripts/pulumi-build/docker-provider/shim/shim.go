// Package clustersessionsshim is laid into a copy of the Terraform docker provider's module by
// scripts/install-pulumi.sh (it is not a file of that module): the provider's package
// internal/provider can only be imported from inside its own module, and the bridge needs its
// *schema.Provider. pulumi-docker does the same with a patch that adds shim.NewProvider
// (pulumi-docker patches/0001-Add-shim.NewProvider-to-expose-internal-provider.New.patch);
// this file is ours.
package clustersessionsshim

import (
	"github.com/hashicorp/terraform-plugin-sdk/v2/helper/schema"
	"github.com/terraform-providers/terraform-provider-docker/internal/provider"
)

// NewProvider is the SDKv2 provider the Terraform provider's own main serves.
func NewProvider(version string) *schema.Provider { return provider.New(version)() }
