"""Fine-tuning throughput: bertjax's sequence classification step against transformers'
FlaxBertForSequenceClassification with optax AdamW, same dimensions, in one process.

  python -m bertjax.benchmarks.finetune_bench [--hidden 256 --layers 4 --heads 4
      --intermediate 1024 --vocab 30522 --seq 128 --batch 32] [--rounds 5 --steps 10]
      [--data glue|random] [--min_bucket 32] [--layer_loop auto|scan|unroll]

--data glue (the default) gives GLUE-like lengths from real text: sentences of
the installed packages' docstrings (bertjax.benchmarks.corpus, no text
repeated), every other example a single sentence (SST-2, CoLA) and the others
two consecutive sentences of a document (MRPC, RTE, MNLI), tokenized with a
WordPiece vocab trained on that text (at most --vocab tokens); the printed
length percentiles show the spread (most under 40 tokens). --data random:
random ids filling all --seq positions.

Three runners train on these examples, in shuffled batches of --batch:
  bertjax (buckets)      bertjax's fine-tuning input (tasks.batches.train_batches
                         with length buckets from --min_bucket doubling up to --seq)
  bertjax (fixed L)      the same step, every batch padded to --seq
  transformers (fixed L) every batch padded to --seq, as run_flax_glue pads
                         (pad_to_max_length)
all with dropout 0.1, gradient clipping at 1.0 and AdamW with weight decay 0.01
(not on biases or LayerNorm), fp32 (or --dtype bfloat16 for bertjax's compute
and transformers' `dtype`). After a warm-up step on each shape the rounds
meet (which compiles it), the runners alternate --rounds times, --steps steps
each (the next batches of each runner's stream); printed: median and range of examples/s over the
rounds, the ratio of the medians to transformers' median, and the median and
range of the ratios within a round (each runner against transformers' rate of
the same round). The process runs with the glibc malloc
settings that `python -m bertjax.finetune` takes for the model (BERTJAX_HOST_MALLOC,
bertjax/records/hostmem.py), all runners alike, and prints which.
"""

import argparse
import importlib.util
import os
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from bertjax.benchmarks import corpus
from bertjax.records import hostmem
from bertjax.model import heads
from bertjax.model import layers
from bertjax.model.config import BertConfig
from bertjax.tasks import batches as batches_lib
from bertjax.tasks import features
from bertjax.tasks import step as step_lib
from bertjax.text import tokenization
from bertjax.text import vocab as vocab_lib
from bertjax.train import optimizer as opt_lib
from bertjax.train import sharding as sharding_lib
from bertjax.train import state as state_lib

_BASE_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "configs", "base.py")


def _mesh_config():
  """configs/base.py's mesh: data parallel over every device, its rules table."""
  spec = importlib.util.spec_from_file_location("base_config", _BASE_CONFIG)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config().mesh


def random_examples(args, count: int) -> dict[str, np.ndarray]:
  """`count` examples of random ids filling every position."""
  rng = np.random.default_rng(0)
  ids = rng.integers(5, args.vocab, (count, args.seq)).astype(np.int32)
  return {"input_ids": ids, "input_mask": np.ones_like(ids),
          "segment_ids": (np.arange(args.seq) >= args.seq // 2).astype(np.int32)[None]
                         .repeat(count, 0),
          "labels": rng.integers(0, 2, count).astype(np.int32)}


def glue_like_examples(args, count: int) -> tuple[dict[str, np.ndarray], int]:
  """(`count` examples of docstring sentences, the vocab's size): every other one a
  single sentence, the others two consecutive sentences of one document."""
  docs = corpus.docstring_corpus(args.corpus_mb << 20)
  with tempfile.TemporaryDirectory() as tmp:
    text_path, vocab_path = os.path.join(tmp, "text.txt"), os.path.join(tmp, "vocab.txt")
    corpus.write_corpus(text_path, docs)
    vocab_lib.build_wordpiece_vocab([text_path], vocab_path, vocab_size=args.vocab)
    tokenizer = tokenization.load_tokenizer("wordpiece", vocab_path)
  texts_a, texts_b = [], []
  for doc in docs:
    for i in range(0, len(doc) - 1, 2):
      single = len(texts_a) % 2 == 0
      texts_a.append(doc[i])
      texts_b.append(None if single else doc[i + 1])
      if len(texts_a) == count:
        break
    if len(texts_a) == count:
      break
  if len(texts_a) < count:
    raise RuntimeError(f"the docstrings give {len(texts_a)} examples, fewer than {count}; "
                       "raise --corpus_mb")
  arrays = features.encode_pairs(tokenizer, texts_a, texts_b, args.seq)
  arrays["labels"] = np.random.default_rng(0).integers(0, 2, count).astype(np.int32)
  return arrays, tokenizer.vocab_size


def batch_streams(args, arrays, num_steps: int) -> dict[str, list]:
  """Each runner's batches: shuffled epochs of `arrays`, bucketed or at --seq."""
  buckets = batches_lib.bucket_lengths(args.seq, args.min_bucket)
  stream = dict(seed=0, num_steps=num_steps, process_index=0, process_count=1)
  return {"bucketed": list(batches_lib.train_batches(arrays, args.batch, buckets=buckets,
                                                     **stream)),
          "fixed": list(batches_lib.train_batches(arrays, args.batch, **stream))}


def _optimizer_config(args):
  return ml_collections.ConfigDict(dict(
      name="adamw", learning_rate=2e-5, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01,
      bias_correction=True, clip_norm=1.0, warmup_steps=0, end_learning_rate=2e-5,
      per_phase_warmup=False))


def bertjax_step(args, config: BertConfig):
  """(step function, state) of bertjax's fine-tuning step on one device mesh."""
  mesh_config = _mesh_config()
  mesh, rules = sharding_lib.make_mesh(mesh_config), sharding_lib.rules(mesh_config)
  opt = _optimizer_config(args)
  tx = opt_lib.make_optimizer(opt, optax.constant_schedule(opt.learning_rate))
  model = heads.BertForSequenceClassification(config, num_labels=2)

  def init(m, rng):
    ids = jnp.zeros((1, args.seq), jnp.int32)
    return m.init({"params": rng}, ids, ids, ids)["params"]
  state, shardings = state_lib.create_train_state(model, tx, mesh, rules, jax.random.key(0),
                                                  init=init)
  train, _ = step_lib.jit_steps(shardings, mesh, "classification")
  batch_sharding = sharding_lib.batch_sharding(mesh)
  rng = jax.random.key(1)

  def run(state, batch):
    with sharding_lib.mesh_context(mesh, rules):
      batch = {k: jax.device_put(v, batch_sharding) for k, v in batch.items()}
      return train(state, batch, rng)
  return run, state


def transformers_step(args, config: BertConfig):
  """(step function, (params, opt_state)) of FlaxBertForSequenceClassification + optax AdamW."""
  import transformers  # pylint: disable=g-import-not-at-top
  hf_config = transformers.BertConfig(
      vocab_size=config.vocab_size, hidden_size=config.hidden_size,
      num_hidden_layers=config.num_layers, num_attention_heads=config.num_heads,
      intermediate_size=config.intermediate_size, num_labels=2, hidden_act="gelu")
  model = transformers.FlaxBertForSequenceClassification(
      hf_config, seed=0, dtype=jnp.dtype(config.dtype))
  opt = _optimizer_config(args)
  tx = optax.chain(optax.clip_by_global_norm(opt.clip_norm), optax.adamw(
      opt.learning_rate, opt.b1, opt.b2, opt.eps, weight_decay=opt.weight_decay,
      mask=jax.tree_util.tree_map_with_path(
          lambda path, _: not (path[-1].key == "bias" or path[-2].key == "LayerNorm"),
          model.params)))

  def loss_fn(params, batch, rng):
    logits = model(batch["input_ids"], attention_mask=batch["input_mask"],
                   token_type_ids=batch["segment_ids"], params=params, dropout_rng=rng,
                   train=True).logits
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()

  @jax.jit
  def train(carry, batch, rng):
    params, opt_state, step = carry
    loss, grads = jax.value_and_grad(loss_fn)(params, batch, jax.random.fold_in(rng, step))
    updates, opt_state = tx.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state, step + 1), loss

  rng = jax.random.key(1)
  return (lambda carry, batch: train(carry, batch, rng)), (
      model.params, tx.init(model.params), jnp.zeros([], jnp.int32))


def _time(step, carry, batches):
  t0 = time.perf_counter()
  for batch in batches:
    carry, out = step(carry, batch)
  jax.block_until_ready(out)
  return carry, time.perf_counter() - t0


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  for name, default in (("hidden", 256), ("layers", 4), ("heads", 4), ("intermediate", 1024),
                        ("vocab", 30522), ("seq", 128), ("batch", 32), ("rounds", 5),
                        ("steps", 10), ("min_bucket", 32), ("examples", 4096),
                        ("corpus_mb", 3)):
    p.add_argument(f"--{name}", type=int, default=default)
  p.add_argument("--dtype", default="float32")
  p.add_argument("--data", default="glue", choices=("glue", "random"))
  p.add_argument("--layer_loop", default="auto", choices=("auto", "scan", "unroll"),
                 help="bertjax's model.layer_loop (auto: unrolled on the CPU at hidden size "
                      "256 or more).")
  args = p.parse_args()
  # As `python -m bertjax.finetune` would run this model (BERTJAX_HOST_MALLOC=auto):
  # the whole process re-executes with the tunables for a large one, the
  # transformers runner included.
  hostmem.reexec_for_model("bertjax.benchmarks.finetune_bench", args.hidden)
  if args.data == "glue":
    arrays, args.vocab = glue_like_examples(args, args.examples)
  else:
    arrays = random_examples(args, args.examples)
  lengths = batches_lib.example_lengths(arrays)
  config = BertConfig(vocab_size=args.vocab, hidden_size=args.hidden, num_layers=args.layers,
                      num_heads=args.heads, intermediate_size=args.intermediate,
                      max_position_embeddings=max(512, args.seq), dtype=args.dtype,
                      layer_loop=args.layer_loop)
  streams = batch_streams(args, arrays, args.rounds * args.steps)
  runners = {"bertjax (buckets)": (*bertjax_step(args, config), streams["bucketed"]),
             "bertjax (fixed L)": (*bertjax_step(args, config), streams["fixed"]),
             "transformers (fixed L)": (*transformers_step(args, config), streams["fixed"])}
  carries = {}
  for name, (step, carry, stream) in runners.items():
    t0 = time.perf_counter()
    seen = {}
    for batch in stream:  # One step on each shape the rounds meet compiles it.
      seen.setdefault(batch["input_ids"].shape, batch)
    carries[name], _ = _time(step, carry, list(seen.values()))
    print(f"{name}: compile + {len(seen)} warm-up steps ({len(seen)} shapes) "
          f"{time.perf_counter() - t0:.1f}s", flush=True)
  rates = {name: [] for name in runners}
  for r in range(args.rounds):
    for name, (step, _, stream) in runners.items():
      batches = stream[r * args.steps:(r + 1) * args.steps]
      carries[name], seconds = _time(step, carries[name], batches)
      rates[name].append(len(batches) * args.batch / seconds)
    print(f"round {r + 1}: " + ", ".join(f"{name} {x[-1]:.1f}" for name, x in rates.items())
          + " examples/s", flush=True)
  shapes = sorted({b["input_ids"].shape[1] for b in streams["bucketed"]})
  print(hostmem.describe())
  print(f"{jax.device_count()} x {jax.devices()[0].device_kind}; L={args.layers} "
        f"H={args.hidden} A={args.heads} F={args.intermediate} V={args.vocab}, "
        f"max_seq_length {args.seq}, batch {args.batch}, {args.dtype}; {args.rounds} rounds "
        f"of {args.steps} steps; bertjax's layers "
        f"{'unrolled' if layers.unrolls(config) else 'in a loop'} "
        f"(model.layer_loop={args.layer_loop})")
  print(f"data {args.data}: {len(lengths)} examples, tokens per example p10/p50/p90/max "
        f"{'/'.join(str(int(np.percentile(lengths, q))) for q in (10, 50, 90, 100))}, "
        f"{(lengths < 40).mean():.0%} under 40; bucketed batch lengths used {shapes}")
  peer = rates["transformers (fixed L)"]
  reference = statistics.median(peer)
  for name, r in rates.items():
    median = statistics.median(r)
    paired = sorted(x / y for x, y in zip(r, peer))
    print(f"{name:>23}: {median:8.1f} examples/s (range {min(r):.1f}-{max(r):.1f}), "
          f"{median / reference:.2f}x transformers; within a round "
          f"{statistics.median(paired):.2f}x ({paired[0]:.2f}-{paired[-1]:.2f}x)")


if __name__ == "__main__":
  main()
