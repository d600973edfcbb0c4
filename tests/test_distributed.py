"""--distributed=auto: which environments join a JAX job of several processes
(bertjax/train/distributed.py, shared by bertjax.main and bertjax.finetune)."""

import pytest

from bertjax.train import distributed

# The variables each environment below sets, by who sets them.
_ONE_PROCESS = {
    "nothing": {},
    "one TPU host (GKE)": {"TPU_WORKER_HOSTNAMES": "host-0", "TPU_WORKER_ID": "0"},
    "one TPU host of one slice": {"TPU_WORKER_HOSTNAMES": "host-0",
                                  "MEGASCALE_NUM_SLICES": "1"},
    "one SLURM task": {"SLURM_NTASKS": "1", "SLURM_PROCID": "0"},
    "empty values": {"TPU_WORKER_HOSTNAMES": "", "JAX_COORDINATOR_ADDRESS": "",
                     "MEGASCALE_COORDINATOR_ADDRESS": "", "MEGASCALE_NUM_SLICES": "",
                     "SLURM_NTASKS": ""},
}
_SEVERAL = {
    "a TPU slice of two hosts (GKE)": {"TPU_WORKER_HOSTNAMES": "host-0,host-1"},
    "TPU process addresses": {"TPU_PROCESS_ADDRESSES": "10.0.0.1:8476,10.0.0.2:8476"},
    "two slices of one host each": {"TPU_WORKER_HOSTNAMES": "host-0",
                                    "MEGASCALE_NUM_SLICES": "2",
                                    "MEGASCALE_SLICE_ID": "1",
                                    "MEGASCALE_COORDINATOR_ADDRESS": "host-0-0:8080"},
    "several slices, number only": {"MEGASCALE_NUM_SLICES": "4"},
    "several slices, coordinator only": {"MEGASCALE_COORDINATOR_ADDRESS": "10.0.0.1"},
    "a JAX coordinator": {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234"},
    "SLURM tasks": {"SLURM_NTASKS": "8"},
}


@pytest.mark.parametrize("name", sorted(_ONE_PROCESS))
def test_one_process(name):
  assert not distributed.multiprocess_env(_ONE_PROCESS[name])


@pytest.mark.parametrize("name", sorted(_SEVERAL))
def test_several_processes(name):
  assert distributed.multiprocess_env(_SEVERAL[name])


@pytest.mark.parametrize("name", ["MEGASCALE_NUM_SLICES", "SLURM_NTASKS"])
def test_a_count_that_is_not_a_number_is_named(name):
  with pytest.raises(ValueError, match=f"{name}='two'.*--distributed=on or off"):
    distributed.multiprocess_env({name: "two"})


def test_initialize_follows_the_mode(monkeypatch):
  calls = []
  monkeypatch.setattr(distributed.jax.distributed, "initialize", lambda: calls.append(1))
  slices = _SEVERAL["two slices of one host each"]
  assert distributed.initialize("auto", slices) and len(calls) == 1
  assert not distributed.initialize("auto", {}) and len(calls) == 1
  assert not distributed.initialize("off", slices) and len(calls) == 1
  assert distributed.initialize("on", {}) and len(calls) == 2
  with pytest.raises(ValueError, match="--distributed=maybe"):
    distributed.initialize("maybe", {})
