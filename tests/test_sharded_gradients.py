"""Gradients on data x fsdp x tensor meshes equal one device's, for every head.

XLA (jax 0.10.2, CPU) computes wrong gradients, about 100% off, of the
weights before a projection onto a table laid out [tensor, fsdp] when the
batch is split over (data, fsdp): `miscompile_gradients` below reproduces it
in plain JAX. bertjax fences it off with the word table's own embed axis
name ('vocab_embed', kept off the batch's mesh axes by the rules and by
decoder.tied_logits). Here the pretraining model and every fine-tuning head
differentiate on 8 CPU devices under the rules table and are compared with
one device. The work runs in a child process (this file as a script; see
jax_child.py).
"""

import json
import os
import sys

import numpy as np
import pytest

import jax_child

pytestmark = pytest.mark.slow

NUM_DEVICES = 8
MESHES = {"data_fsdp_tensor": (2, 2, 2), "fsdp_tensor": (1, 4, 2), "data_fsdp": (2, 4, 1)}
HEADS = ("pretraining", "classification", "regression", "token", "multiple_choice", "span")
VOCAB, HIDDEN, NUM_HEADS, MLP, LAYERS = 96, 32, 4, 64, 2
BATCH, LENGTH, PREDICTIONS, CHOICES = 8, 16, 3, 2


def miscompile_gradients(table_spec):
  """Relative error of the sharded gradients of x @ w, a scale, logits
  against a table and cross entropy, against one device's: (w, scale, table)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top

  mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 3)
  k = jax.random.split(jax.random.key(0), 4)
  x, w = jax.random.normal(k[0], (8, 4, 16)), jax.random.normal(k[1], (16, 16)) * 0.3
  scale, table = jnp.full((16,), 1.1), jax.random.normal(k[2], (64, 16)) * 0.3
  labels = jax.random.randint(k[3], (8, 4), 0, 64)

  def loss(w, scale, table, x, labels):
    h = jnp.einsum("bpd,de->bpe", x, w) * scale
    logits = jnp.einsum("bpd,vd->bpv", h, table)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[..., None], -1))

  grad = jax.grad(loss, argnums=(0, 1, 2))
  want = grad(w, scale, table, x, labels)
  put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, P(*spec)))
  got = jax.jit(grad)(put(w, ("fsdp", "tensor")), put(scale, ()), put(table, table_spec),
                      put(x, (("data", "fsdp"),)), put(labels, (("data", "fsdp"),)))
  return [float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b))) for a, b in zip(got, want)]


def _batch(head: str, rng):
  lengths = rng.integers(LENGTH // 2, LENGTH + 1, BATCH)
  shape = (BATCH, CHOICES, LENGTH) if head == "multiple_choice" else (BATCH, LENGTH)
  mask = (np.arange(LENGTH) < (lengths[:, None, None] if len(shape) == 3
                               else lengths[:, None])).astype(np.int32)
  mask = np.broadcast_to(mask, shape).copy()
  batch = dict(input_ids=(rng.integers(5, VOCAB, shape) * mask).astype(np.int32),
               input_mask=mask,
               segment_ids=((np.arange(LENGTH) >= LENGTH // 2) * mask).astype(np.int32))
  if head == "pretraining":
    batch["masked_lm_positions"] = np.stack(
        [np.sort(rng.choice(np.arange(1, n), PREDICTIONS, replace=False)) for n in lengths]
    ).astype(np.int32)
  return batch


def _models():
  from bertjax.model import heads  # pylint: disable=g-import-not-at-top
  from bertjax.model.bert import BertForPreTraining  # pylint: disable=g-import-not-at-top
  from bertjax.model.config import BertConfig  # pylint: disable=g-import-not-at-top
  c = BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_layers=LAYERS, num_heads=NUM_HEADS,
                 intermediate_size=MLP, max_position_embeddings=LENGTH, vocab_multiple=128)
  return {"pretraining": BertForPreTraining(c),
          "classification": heads.BertForSequenceClassification(c, num_labels=3),
          "regression": heads.BertForSequenceClassification(c, num_labels=1),
          "token": heads.BertForTokenClassification(c, num_labels=5),
          "multiple_choice": heads.BertForMultipleChoice(c),
          "span": heads.BertForQuestionAnswering(c)}


def _child(payload) -> dict:
  """In the 8-device child: the reproduction and the heads' gradients."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import ml_collections  # pylint: disable=g-import-not-at-top

  from bertjax.train import sharding as sharding_lib  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, os.path.join(jax_child.REPO, "configs"))
  import base  # pylint: disable=g-import-not-at-top

  if payload == "reproduction":
    return {"bad": miscompile_gradients(("tensor", "fsdp")),
            "vocab_sharded": miscompile_gradients((("tensor", "fsdp"), None))}

  config = base.get_config()
  rules = sharding_lib.rules(config.mesh)
  rng = np.random.default_rng(0)
  errors = {}
  for head, model in _models().items():
    batch = _batch(head, rng)
    args = [batch[k] for k in ("input_ids", "input_mask", "segment_ids")]
    if head == "pretraining":
      args.append(batch["masked_lm_positions"])
    boxed = jax.eval_shape(lambda m=model, a=args: m.init(jax.random.key(0), *a))["params"]
    params = jax.tree.map(lambda x: rng.normal(0, 0.1, x.shape).astype(np.float32),
                          nn.unbox(boxed))
    outputs = jax.eval_shape(lambda m=model, p=params, a=args: m.apply({"params": p}, *a))
    weights = jax.tree.map(lambda o: rng.normal(0, 1, o.shape).astype(np.float32), outputs)

    def loss(p, *a, m=model, w=weights):
      out = m.apply({"params": p}, *a)
      return sum(jnp.sum(jnp.where(o > -1e30, o, 0.0) * wt)
                 for o, wt in zip(jax.tree.leaves(out), jax.tree.leaves(w)))

    want = jax.jit(jax.grad(loss))(params, *args)
    errors[head] = {}
    for mesh_name, sizes in MESHES.items():
      mesh_config = ml_collections.ConfigDict(
          dict(config.mesh, **dict(zip(sharding_lib.MESH_AXES, sizes))))
      mesh = sharding_lib.make_mesh(mesh_config)
      shardings = sharding_lib.logical_to_sharding(nn.get_partition_spec(boxed), mesh, rules)
      with sharding_lib.mesh_context(mesh, rules):
        got = jax.jit(jax.grad(loss))(
            jax.device_put(params, shardings),
            *[jax.device_put(a, sharding_lib.batch_sharding(mesh)) for a in args])
      # Relative to each leaf's largest gradient, floored at a thousandth of
      # the largest of all (the attention key bias's true gradient is zero).
      floor = 1e-3 * max(float(np.max(np.abs(np.asarray(r)))) for r in jax.tree.leaves(want))
      errors[head][mesh_name] = max(
          float(np.max(np.abs(np.asarray(g) - np.asarray(r)))
                / max(float(np.max(np.abs(np.asarray(r)))), floor))
          for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(want)))
  return {"devices": jax.device_count(), "errors": errors}


@pytest.fixture(scope="module")
def reproduction(tmp_path_factory):
  result, _ = jax_child.run(os.path.abspath(__file__), "reproduction", devices=NUM_DEVICES,
                            cache=jax_child.cache_dir(tmp_path_factory))
  return result


@pytest.mark.xfail(strict=True, reason=(
    "XLA (jax 0.10.2, CPU) computes wrong gradients before a projection onto a table laid "
    "out [tensor, fsdp] with the batch split over (data, fsdp). When this passes, the "
    "compiler is fixed: the fence in decoder.tied_logits may then be relaxed."))
def test_plain_jax_reproduction_of_the_miscompile(reproduction):
  w_err, scale_err, table_err = reproduction["bad"]
  assert table_err < 1e-5  # The table's own gradient is right ...
  assert w_err < 1e-5 and scale_err < 1e-5  # ... the weights before it are not.


def test_the_vocab_sharded_table_layout_differentiates_correctly(reproduction):
  assert max(reproduction["vocab_sharded"]) < 1e-5, reproduction["vocab_sharded"]


def test_every_head_differentiates_on_sharded_meshes_as_on_one_device(tmp_path_factory):
  result, _ = jax_child.run(os.path.abspath(__file__), "heads", devices=NUM_DEVICES,
                            cache=jax_child.cache_dir(tmp_path_factory))
  assert result["devices"] == NUM_DEVICES
  assert sorted(result["errors"]) == sorted(HEADS)
  for head, by_mesh in result["errors"].items():
    assert sorted(by_mesh) == sorted(MESHES)
    for mesh_name, err in by_mesh.items():
      assert err < 1e-4, f"{head} on {mesh_name}: relative gradient error {err:.3g}"


def test_rules_that_put_the_tables_embed_axis_on_a_batch_axis_are_refused():
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  from bertjax.model import decoder  # pylint: disable=g-import-not-at-top
  from bertjax.model.config import BertConfig  # pylint: disable=g-import-not-at-top
  c = BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_layers=1, num_heads=NUM_HEADS,
                 intermediate_size=MLP)
  x, table, bias = jnp.ones((2, 3, HIDDEN)), jnp.ones((VOCAB, HIDDEN)), jnp.zeros((VOCAB,))
  bad = (("activation_batch", ("data", "fsdp")), ("vocab", "tensor"), ("vocab_embed", "fsdp"))
  with nn.logical_axis_rules(bad):
    with pytest.raises(ValueError, match="vocab_embed.*fsdp"):
      decoder.tied_logits(x, table, bias, c)
  good = (("activation_batch", ("data", "fsdp")), ("vocab", ("tensor", "fsdp")),
          ("vocab_embed", None))
  with nn.logical_axis_rules(good):
    assert decoder.tied_logits(x, table, bias, c).shape == (2, 3, VOCAB)


if __name__ == "__main__":
  print(json.dumps(_child(json.loads(sys.argv[1]))))
