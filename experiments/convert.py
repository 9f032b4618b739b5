"""Convert a Hugging Face checkpoint into a tfjax workdir, or a workdir back into a checkpoint.

    python -m experiments.convert --hf_dir=checkpoints/gpt2 --workdir=runs/gpt2
    python -m experiments.convert --to_hf --workdir=runs/gpt2_tuned --hf_dir=exported/gpt2

Import (the default): `--hf_dir` is a local directory as `save_pretrained` or
`hf download REPO --local-dir DIR` writes it (config.json, model.safetensors or
pytorch_model.bin, the tokenizer's files); nothing is downloaded. Supported: GPT-2, BERT,
T5 v1.0 / v1.1 and Marian (`tfjax.pretrained.FAMILIES`). The new `--workdir` is an ordinary
tfjax workdir with a checkpoint at step 0: `experiments.generate`, `translate` and `evaluate`
read it, and `python -m experiments.train --config=WORKDIR/config.json --workdir=WORKDIR`
fine-tunes it (or `--config.train.init_from=WORKDIR` starts a new run from it). `--config`
gives the run's data, optimizer and loop (default `configs/pretrained.py:<model kind>`, an
embedded task; `encoder_only_mlm` for BERT's masked-LM head), `--config.a.b=value` overrides
it, and `--head` picks BERT's head ("mlm" or "classify"; default: the one config.json names).

Length limits come from the checkpoint, not the preset (docs/pretrained.md, "Length limits of
a converted workdir"); a `--config.data.max_source_len=N` (or `max_target_len`) flag keeps its
value, and one longer than a learned position table is refused.

Export (`--to_hf`): writes the latest checkpoint (or `--step`) of a converted or fine-tuned
workdir as a directory `transformers` loads (`from_pretrained(hf_dir)`), with the tokenizer.

A checkpoint the model cannot hold exactly (another architecture, a missing, unknown or
misshapen tensor, an option it cannot compute, a tokenizer that does not fit) stops with a
one-line error naming it (docs/pretrained.md).
"""

from absl import flags

from experiments import cli, config_utils

FLAGS = flags.FLAGS


def main(argv, overrides):
    cli.no_arguments(argv)
    cli.quiet_logs()
    from tfjax.runs import pretrained as runs_pretrained

    if FLAGS.to_hf:
        if overrides or FLAGS.head or FLAGS.config:
            raise cli.UsageError("--to_hf exports a workdir as it is: drop --config and --head")
        step = runs_pretrained.export(FLAGS.workdir, FLAGS.hf_dir, step=FLAGS.step)
        print(f"wrote step {step} of {FLAGS.workdir} to {FLAGS.hf_dir}")
        return
    from tfjax import pretrained

    hf_config = pretrained.read_hf_config(FLAGS.hf_dir)
    model_config = pretrained.model_config(hf_config, head=FLAGS.head)  # refuses bad input early
    preset = model_config.kind + ("_mlm" if pretrained.head_of(model_config) == "mlm" else "")
    spec = FLAGS.config or f"configs/pretrained.py:{preset}"
    config = config_utils.load_config(spec, overrides)
    explicit = {override.split("=", 1)[0].strip() for override in overrides}
    config = runs_pretrained.convert(
        FLAGS.hf_dir, FLAGS.workdir, config, head=FLAGS.head, explicit=explicit
    )
    lengths = ", ".join(f"{key}={config.data[key]}" for key in ("max_source_len", "max_target_len"))
    print(
        f"wrote {FLAGS.workdir}: a {config.model.kind} model at step 0 ({lengths}); "
        "fine-tune it with "
        f"python -m experiments.train --config={FLAGS.workdir}/config.json "
        f"--workdir={FLAGS.workdir}"
    )


def _define_flags() -> None:
    """Flags exist only when run as a script, so importing this module defines none."""
    flags.DEFINE_string("hf_dir", None, "Hugging Face checkpoint directory (--to_hf: written).")
    flags.DEFINE_string("workdir", None, "tfjax workdir (written, or --to_hf read).")
    flags.DEFINE_bool("to_hf", False, "Export --workdir to --hf_dir instead of importing.")
    flags.DEFINE_string("config", None, "Run config (default: configs/pretrained.py:<kind>).")
    flags.DEFINE_string("head", None, "BERT's head: mlm or classify (default: config.json's).")
    flags.DEFINE_integer("step", None, "--to_hf: checkpoint step (default: the latest good one).")
    flags.mark_flags_as_required(["hf_dir", "workdir"])


if __name__ == "__main__":
    _define_flags()
    cli.main(main, config_overrides=True)
