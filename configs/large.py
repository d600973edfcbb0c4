"""BERT-LARGE: BASE with L=24, H=1024, A=16 (about 335M parameters).

The paper trained it on 64 TPU chips for four days, with BASE's schedule.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import base  # pylint: disable=g-import-not-at-top,wrong-import-position


def get_config():
  config = base.get_config()
  config.model.hidden_size = 1024  # H.
  config.model.num_layers = 24  # L.
  config.model.num_heads = 16  # A.
  config.model.intermediate_size = 4096  # 4H.
  config.model.remat_policy = "dots_no_batch"  # Keep matmul outputs, recompute the rest: fits 512-long sequences on chips with less memory (at 512 on v5p-8, batch 256: 24.46 GiB per device against 46.26 without recomputation).
  config.phases.seq128.remat_policy = "none"  # At 128 nothing needs recomputing (v5p-8, batch 256: 9.96 GiB per device, 6.47 with dots_no_batch); `python -m bertjax.fit --remat_policy=none,dots_no_batch` checks a slice.
  config.mesh.data = 1  # Fully sharded data parallel over each slice's chips by default:
  config.mesh.fsdp = -1  # parameters and optimizer state split across the slice (and data parallel across slices: mesh.dcn_data).
  return config
