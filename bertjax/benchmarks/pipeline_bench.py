"""Input pipeline throughput: sequences per second per host.

  python -m bertjax.benchmarks.pipeline_bench [--records_128 50000]
      [--records_512 10000] [--files 16] [--batch 256] [--seconds 10]

Writes temporary datasets of random pre-masked records (128/20 and 512/80,
each in --files shards with index files), then for each reads batches from
TrainSource for --seconds after a warm-up, as one host of one, and prints
sequences/s. Also timed: order="global", shuffle_block=64 and dynamic masking.
The files were just written, so they are read from the page cache.
"""

import argparse
import os
import tempfile
import time

import numpy as np

from bertjax.create import records
from bertjax.input import pipeline
from bertjax.records import schema

SPECIAL_IDS = {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}


def write_dataset(directory: str, num_records: int, num_files: int, max_seq_length: int,
                  max_pred: int, vocab_size: int = 30522, seed: int = 0) -> str:
  """Random pre-masked records in `num_files` shards; returns the glob."""
  rng = np.random.default_rng(seed)
  encoder = records.ExampleEncoder(max_seq_length, max_pred)
  per_file = -(-num_records // num_files)
  files, num_tokens = [], 0
  for f in range(num_files):
    count = min(per_file, num_records - f * per_file)
    lengths = rng.integers(max_seq_length // 2, max_seq_length + 1, count)
    data = []
    for n in lengths:
      ids = rng.integers(5, vocab_size, n)
      ids[0], ids[n // 2], ids[-1] = 2, 3, 3
      k = min(max_pred, max(1, round(n * 0.15)))
      pos = np.sort(rng.choice(np.arange(1, n - 1), k, replace=False))
      data.append(encoder.encode(ids.tolist(), int(n // 2 - 1), pos.tolist(),
                                 ids[pos].tolist(), bool(rng.integers(2))))
    name = records.shard_name(f, num_files)
    records.write_shard(os.path.join(directory, name), data)
    files.append({"name": name, "num_instances": int(count)})
    num_tokens += int(lengths.sum())
  schema.write_metadata(directory, schema.DatasetMetadata(
      max_seq_length=max_seq_length, max_predictions_per_seq=max_pred,
      vocab_size=vocab_size, vocab_hash="", special_ids=SPECIAL_IDS,
      tokenizer={"type": "random"}, masking={"masked_lm_prob": 0.15, "premasked": True},
      num_instances=num_records, num_tokens=num_tokens, random_seed=seed,
      source="bertjax.benchmarks.pipeline_bench", files=files))
  return os.path.join(directory, "part-*.tfrecord")


def measure(source: pipeline.TrainSource, seconds: float, warmup_batches: int = 20) -> float:
  it = source.iterate(0)
  for _ in range(warmup_batches):
    next(it)
  n, start = 0, time.perf_counter()
  while time.perf_counter() - start < seconds:
    n += len(next(it)["input_ids"])
  rate = n / (time.perf_counter() - start)
  it.close()
  return rate


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--records_128", type=int, default=50_000)
  parser.add_argument("--records_512", type=int, default=10_000)
  parser.add_argument("--files", type=int, default=16)
  parser.add_argument("--batch", type=int, default=256)
  parser.add_argument("--seconds", type=float, default=10.0)
  parser.add_argument("--read_threads", type=int, default=4)
  args = parser.parse_args()
  with tempfile.TemporaryDirectory() as tmp:
    runs = [("len 128 (order=files, default)", 128, 20, args.records_128, {}),
            ("len 512 (order=files, default)", 512, 80, args.records_512, {}),
            ("len 128 order=global", 128, 20, args.records_128, {"order": "global"}),
            ("len 128 order=files, shuffle_block=64", 128, 20, args.records_128,
             {"shuffle_block": 64}),
            ("len 128 dynamic masking", 128, 20, args.records_128,
             {"dynamic_masking": {}}),
            ("len 512 dynamic masking", 512, 80, args.records_512,
             {"dynamic_masking": {}})]
    globs = {}
    print(f"cpu cores: {os.cpu_count()}  host batch: {args.batch}  files: {args.files}")
    for name, length, pred, count, options in runs:
      if length not in globs:
        start = time.perf_counter()
        directory = os.path.join(tmp, f"len{length}")
        os.makedirs(directory)
        globs[length] = write_dataset(directory, count, args.files, length, pred)
        print(f"wrote {count} records of length {length} in "
              f"{time.perf_counter() - start:.1f}s")
      source = pipeline.TrainSource(
          globs[length], args.batch, max_seq_length=length, max_predictions_per_seq=pred,
          seed=0, process_index=0, process_count=1, read_threads=args.read_threads,
          **options)
      rate = measure(source, args.seconds)
      print(f"{name}: {rate:,.0f} sequences/s per host")


if __name__ == "__main__":
  main()
