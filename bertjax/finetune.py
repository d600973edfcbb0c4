"""Fine-tunes BERT on a downstream task:

  python -m bertjax.finetune --config=configs/finetune/glue.py --config.task=mrpc \
      --config.init_from=WORKDIR/checkpoints --config.vocab_file=DATA/vocab.txt \
      --config.data_dir=glue_data/MRPC --workdir=DIR

writes checkpoints, TensorBoard events and DIR/results.json (final dev
metrics). --config.sweep.enabled runs the learning-rate grid (and seeds),
one run per subdirectory, and DIR/results.json reports the best with every
run's figures. --config.mode=predict writes test-set prediction files (GLUE
submission TSVs, SQuAD predictions.json, ...) to DIR/predictions with the
fine-tuned checkpoint in DIR/checkpoints (or --config.predict_from), no
training; --config.mode=train_and_predict does both.
"""

# glibc reads its malloc tunables at start-up: on the CPU, this program's own
# command line re-executes itself once with them, before the imports below
# with BERTJAX_HOST_MALLOC=tuned, or once the model is known for a large one
# (auto, the default; bertjax/records/hostmem.py); imported from Python it
# does not.
from bertjax.records import hostmem  # pylint: disable=g-bad-import-order
hostmem.reexec_for_cpu("bertjax.finetune")

from absl import app
from absl import flags
from ml_collections import config_flags

from bertjax import downstream
from bertjax.train import cli
from bertjax.train import distributed

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Fine-tuning config file (configs/finetune/glue.py, ...).",
    lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Checkpoints, TensorBoard events and "
                               "results.json go here (local path or gs://).", required=True)
_DISTRIBUTED = flags.DEFINE_enum("distributed", "auto", distributed.MODES, distributed.HELP)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  # The --config.* fields given on the command line keep their values; the
  # others of the architecture and the casing come from init_from's checkpoint.
  explicit = frozenset(config_flags.get_override_values(flags.FLAGS["config"]))
  hostmem.reexec_for_model(  # Before anything starts.
      "bertjax.finetune", downstream.hidden_size(_CONFIG.value, _WORKDIR.value, explicit))
  distributed.initialize(_DISTRIBUTED.value)
  downstream.finetune(_CONFIG.value, _WORKDIR.value, explicit)


def run():
  cli.run(main)


if __name__ == "__main__":
  run()
