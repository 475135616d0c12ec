// pulumi-resource-docker as this project builds it where pulumi-docker's own provider module
// cannot be had (the Go module proxy serves no github.com/pulumi/pulumi-docker/provider/...;
// docs/provider-fidelity.md): the Terraform docker provider (kreuzwerker, the code that makes
// every container and network, read back and diffed) served through Pulumi's Terraform bridge,
// with the package name, resource tokens and per-resource options the pulumi-docker Python SDK
// expects. Those options are the ones pulumi-docker's provider/resources.go sets for what this
// project uses (read there, at 237b7899): the provider's `host` default (DOCKER_HOST, else the
// local socket), `registry_auth` not made plural, docker_container with DeleteBeforeReplace and
// `command`/`networks_advanced` not renamed, docker_image as RemoteImage, and the other
// resources' tokens. Not here: pulumi-docker's own native resources (docker.Image, the
// buildx builds) and its docs.
//
// The schema the bridge serves is generated in the process from this mapping at start
// (tfgen.GenerateSchemaWithOptions), not embedded.
package main

import (
	"context"
	"encoding/json"
	"os"
	"unicode"

	"github.com/pulumi/pulumi-terraform-bridge/v3/pkg/tfbridge"
	"github.com/pulumi/pulumi-terraform-bridge/v3/pkg/tfbridge/tokens"
	"github.com/pulumi/pulumi-terraform-bridge/v3/pkg/tfgen"
	shimv2 "github.com/pulumi/pulumi-terraform-bridge/v3/pkg/tfshim/sdk-v2"
	"github.com/pulumi/pulumi/sdk/v3/go/common/diag"
	"github.com/pulumi/pulumi/sdk/v3/go/common/diag/colors"
	ptokens "github.com/pulumi/pulumi/sdk/v3/go/common/tokens"
	"github.com/pulumi/pulumi/sdk/v3/go/common/util/cmdutil"
	"github.com/terraform-providers/terraform-provider-docker/clustersessionsshim"
)

// Version is the plugin's version: the pinned pulumi-docker SDK's, which is what the engine
// asks for (-ldflags "-X main.Version=...").
var Version = "0.0.0"

func resource(name string) ptokens.Type {
	file := string(unicode.ToLower(rune(name[0]))) + name[1:]
	return ptokens.Type("docker:index/" + file + ":" + name)
}

func info() tfbridge.ProviderInfo {
	prov := tfbridge.ProviderInfo{
		P:       shimv2.NewProvider(clustersessionsshim.NewProvider(Version)),
		Name:    "docker",
		Version: Version,
		Config: map[string]*tfbridge.SchemaInfo{
			"host": {Default: &tfbridge.DefaultInfo{
				EnvVars: []string{"DOCKER_HOST"},
				ComputeDefault: func(context.Context, tfbridge.ComputeDefaultOptions) (interface{}, error) {
					return "unix:///var/run/docker.sock", nil
				},
			}},
			"registry_auth": {Name: "registryAuth", MaxItemsOne: tfbridge.False()},
		},
		Resources: map[string]*tfbridge.ResourceInfo{
			"docker_container": {
				Tok:                 resource("Container"),
				DeleteBeforeReplace: true,
				Fields: map[string]*tfbridge.SchemaInfo{
					"command":           {Name: "command"},
					"networks_advanced": {Name: "networksAdvanced"},
				},
			},
			"docker_image": {
				Tok:    resource("RemoteImage"),
				Fields: map[string]*tfbridge.SchemaInfo{"name": {Name: "name"}},
			},
			"docker_network":        {Tok: resource("Network")},
			"docker_volume":         {Tok: resource("Volume")},
			"docker_config":         {Tok: resource("ServiceConfig")},
			"docker_secret":         {Tok: resource("Secret")},
			"docker_service":        {Tok: resource("Service")},
			"docker_registry_image": {Tok: resource("RegistryImage")},
			"docker_plugin":         {Tok: resource("Plugin")},
			"docker_tag":            {Tok: resource("Tag")},
			"docker_buildx_builder": {Tok: resource("BuildxBuilder")},
		},
	}
	// The data sources the standard way: docker_x -> docker:index/getX:getX.
	prov.MustComputeTokens(tokens.SingleModule("docker_", "index", tokens.MakeStandard("docker")))
	return prov
}

func main() {
	prov := info()
	sink := diag.DefaultSink(os.Stderr, os.Stderr, diag.FormatOptions{Color: colors.Never})
	res, err := tfgen.GenerateSchemaWithOptions(tfgen.GenerateSchemaOptions{
		ProviderInfo: prov, DiagnosticsSink: sink, XInMemoryDocs: true})
	if err != nil {
		cmdutil.ExitError(err.Error())
	}
	schema, err := json.Marshal(res.PackageSpec)
	if err != nil {
		cmdutil.ExitError(err.Error())
	}
	tfbridge.Main("docker", Version, prov, schema)
}
