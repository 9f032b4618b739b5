"""Plan a training run for a TPU slice this machine does not have: compile the step ahead of time.

  python -m experiments.plan --config=configs/wmt14.py:big --topology=v5e:4x4 --mesh=data:4,fsdp:4

compiles the config's real train step for the slice (TPU topologies need libtpu, the `tpu`
extra: pip install "tfjax[tpu]"; `--topology=cpu:8` uses simulated CPU devices and needs
nothing) and prints, per device: parameter, optimizer-state and batch bytes, the compiler's
memory estimate against the chip's HBM, the collectives in the compiled program, model and
compiled FLOPs per step, and a roofline step time from the chip's datasheet
(`tfjax.runs.plan`). Nothing runs and nothing is allocated.

`--mesh=data:D,fsdp:F,tensor:T` sets `parallel.mode=sharded`, `parallel.fsdp=F` and
`parallel.tensor=T` (each axis of `tfjax.parallel.strategies.MESH_AXES` but data sets the
`parallel` field of its name; every parameter is then laid out by `parallel.rules`); `data`
may be left out (it takes the devices left), and so may any other axis (size 1). Without it
the config's own `parallel` group applies; any field can be overridden with `--config.a.b=value`.
`--chip=v5e` gives a CPU topology a datasheet. `--json` prints the plan as one JSON object.
Errors the user can fix print one line and exit with status 2 (`experiments/cli.py`).
"""

import contextlib
import json
import os
import re
import sys
import tempfile

from absl import flags

from experiments import cli, config_utils

FLAGS = flags.FLAGS


def _define_flags() -> None:
    """Flags exist only when run as a script, so importing this module defines none."""
    flags.DEFINE_string("config", "configs/base.py", "Config file, optionally with :preset.")
    flags.DEFINE_string(
        "topology", None, "What to compile for: a TPU slice GEN:SHAPE (v5e:4x4) or cpu:N."
    )
    flags.DEFINE_string("mesh", None, "Mesh axes and sizes, e.g. data:2,fsdp:4,tensor:2.")
    flags.DEFINE_string(
        "chip", None, "Datasheet to compare with: v4, v5e, v5p, v6e, h100, h100_pcie, h200, a100."
    )
    flags.DEFINE_bool("json", False, "Print the plan as one JSON object.")
    flags.mark_flags_as_required(["topology"])


# What libtpu prints when it starts on a machine that is not a TPU VM; harmless here.
_LIBTPU_NOTICE = re.compile(r"could not determine TPU (accelerator type|worker hostnames)")


def main(argv, overrides):
    cli.no_arguments(argv)
    cli.quiet_logs()
    config = config_utils.load_config(FLAGS.config, overrides)
    _start_jax(FLAGS.topology)
    from tfjax.parallel import topology as topology_lib
    from tfjax.runs import plan, validation

    validation.check_config(config)  # one line before libtpu starts
    with _without_libtpu_notices():
        topology = topology_lib.get_topology(FLAGS.topology, FLAGS.chip)
    if FLAGS.mesh:
        config = plan.apply_mesh(config, FLAGS.mesh, len(topology.devices))
    result = plan.plan(config, topology)
    if FLAGS.json:
        print(json.dumps({"config": FLAGS.config, **result.to_dict()}))
    else:
        print("\n".join(plan.report(result, FLAGS.config)))


def _start_jax(topology: str) -> None:
    """The local backend is the CPU whatever this machine has: planning runs nothing. libtpu
    is told that this is not a TPU VM (no metadata server to ask, no peers) and that it may
    load beside a process that holds this machine's TPUs (compiling touches none)."""
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    import jax

    jax.config.update("jax_platforms", "cpu")
    count = topology.removeprefix("cpu:")
    if topology.startswith("cpu:") and count.isdigit():
        with contextlib.suppress(RuntimeError):  # backends already up (tests): keep theirs
            jax.config.update("jax_num_cpu_devices", int(count))


@contextlib.contextmanager
def _without_libtpu_notices():
    """Passes on what is written to stderr (fd 2) inside, but libtpu's start-up notices."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            for line in capture.read().decode(errors="replace").splitlines():
                if not _LIBTPU_NOTICE.search(line):
                    print(line, file=sys.stderr)


if __name__ == "__main__":
    _define_flags()
    cli.main(main, config_overrides=True, compilation_cache=False)  # it times compilation
