"""What the docker provider does with what the ``Session`` component passes it: one home for
the evidence in ``docs/provider-fidelity.md``.

Read from pulumi-docker 5.x, which bridges kreuzwerker/terraform-provider-docker v4.5.0
(``upstream`` submodule at 5074970c): ``internal/provider/resource_docker_container.go`` (the
schema: which arguments force a new container), ``resource_docker_container_funcs.go`` (create:
create -> network connect -> uploads -> start; read: what comes back into the state) and
``resource_docker_network*.go``. Pure: no pulumi, no I/O.

Why it matters: after ``up`` the state holds what the provider *read back*; the next ``up``
diffs the program's inputs against it. An argument we spell differently from the read-back
shows as a change on every ``up``, and a change to an argument that forces a new resource
replaces it.
"""

from __future__ import annotations

import itertools
from fractions import Fraction

UPSTREAM = "kreuzwerker/terraform-provider-docker v4.5.0 (5074970c), bridged by pulumi-docker 5.x"

# docker.Container arguments the Session passes, and whether a change to each replaces the
# container (ForceNew in the schema) or is applied in place (resourceDockerContainerUpdate,
# rcf.go 1016-1019: restart, memory, memory_swap; must_run starts it again). ``uploads`` is the
# provider's ``upload``.
CONTAINER_FORCE_NEW: dict[str, bool] = {
    "name": True, "image": True, "hostname": True, "networks_advanced": True, "envs": True,
    "uploads": True, "entrypoints": True, "command": True, "cpus": True, "memory": False,
    "memory_swap": False, "shm_size": True, "device_requests": True, "mounts": True,
    "labels": True, "restart": False, "must_run": False, "init": False, "wait": False,
    "ports": True, "tmpfs": False, "log_driver": True, "log_opts": True,
    "capabilities": True, "security_opts": True,
}
# The session network's arguments (pulumi_layer/network.py SessionNetwork, our own resource
# since the provider's docker.Network waits 2 s per create and delete): every one forces a
# new network, as each forced a new docker.Network (rn.go).
NETWORK_FORCE_NEW: dict[str, bool] = {
    "name": True, "driver": True, "attachable": True, "options": True, "labels": True,
}
# Left out of diff's review: what the Session sets there (MTU, encryption) is in the network's
# name (plan.network_name), so the review names the name's change. (docker.Network read back
# every option Docker adds, an overlay's "com.docker.network.driver.overlay.vxlanid_list";
# SessionNetwork reads nothing back.)
NETWORK_IGNORED = ("options",)

NANO = 10**9


def cpus_read_back(nano_cpus: int) -> str:
    """The ``cpus`` string the provider writes into the state for ``HostConfig.NanoCPUs``
    (helpers.go ``nanoInt64ToDecimalString``): nine decimals, then "x.y" when the text holds
    exactly nine zeros, else the trailing zeros cut (so 1 CPU reads "1.0", 10 reads "10.")."""
    if nano_cpus == 0:
        return "0"
    whole, frac = divmod(nano_cpus, NANO)
    text = f"{whole}.{frac:09d}"
    if text.count("0") == 9:
        tenths = Fraction(nano_cpus, NANO) * 10  # big.Rat.FloatString(1): half away from 0
        rounded = int(tenths + Fraction(1, 2))
        return f"{rounded // 10}.{rounded % 10}"
    return text.rstrip("0")


def parse_cpus(text: str) -> int:
    """NanoCPUs of a ``cpus`` string, as the provider parses it (docker/cli ``ParseCPUs``)."""
    return int(Fraction(text) * NANO)  # Fraction reads "10." as big.Rat does


def cpus_argument(cpu: float) -> str | None:
    """What to pass as ``cpus`` so that the provider reads the same text back (no diff on the
    next up), or None when no spelling of this value survives its read-back."""
    nano = round(cpu * NANO)
    text = cpus_read_back(nano)
    return text if parse_cpus(text) == nano else None


def stable_cpus_near(cpu: float) -> float:
    """The nearest value, in thousandths, that survives the read-back (for an error's hint;
    the larger one of two as near). There is one within 0.011 of any value: the values whose
    nine decimals hold nine zeros come in runs of at most ten thousandths (0.001-0.010)."""
    milli = round(cpu * 1000)
    for step in itertools.count(1):
        for candidate in (milli + step, milli - step):
            if candidate > 0 and cpus_argument(candidate / 1000) is not None:
                return candidate / 1000


def capabilities_argument(names) -> tuple[str, ...]:
    """What to pass as a container's ``capabilities.add``/``drop`` so that the provider reads
    the same set back: the Docker client the provider is built with (docker/docker v28.5.2,
    ``client/container_create.go`` ``normalizeCapabilities``) upper-cases each name, prefixes
    ``CAP_`` (``ALL`` stays), drops duplicates and sorts before it creates the container, the
    engine stores that, and the provider's read (rcf.go 870-878) writes it into the state. A
    bare ``CHOWN`` therefore differs from the refreshed state on every ``up``, and
    ``capabilities`` is ForceNew: every container was replaced (seen through the real engine,
    issue 42)."""
    spelled = {n.upper() if n.upper() == "ALL" or n.upper().startswith("CAP_")
               else "CAP_" + n.upper() for n in names}
    return tuple(sorted(spelled))


GPU_DRIVER = "nvidia"  # Docker's own device driver for NVIDIA GPUs (what `--gpus` selects)


def gpu_device_request(ids: tuple[int, ...]) -> dict | None:
    """The ``device_requests`` entry for these GPU ids (rc.go 774-825), or None for none.

    Not ``gpus``: the provider parses that with docker/cli's ``GpuOpts.Set`` (rcf.go 417-428)
    after stripping outer quotes (``normalizeGPUOptionString``, rcf.go 705-718), so
    ``device=0,1`` is the CSV fields ``device=0`` and ``1``, i.e. DeviceIDs [0] *and* Count 1,
    which the engine refuses at start ("cannot set both Count and DeviceIDs"); and a form that
    does parse (``driver=nvidia,"device=0,1"``) reads back as ``device=0,1`` (rcf.go 720-748),
    a force-new diff on every up. ``device_requests`` is passed as given (rcs.go 332-363) and
    read back field by field (rcf.go 926-929, rcs.go 500-524): ``count`` is left at its
    default 0, as the engine requires with device ids."""
    if not ids:
        return None
    return {"driver": GPU_DRIVER, "device_ids": tuple(str(i) for i in ids),
            "capabilities": ("gpu",)}
