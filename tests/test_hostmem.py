"""glibc malloc settings for CPU runs (bertjax/records/hostmem.py)."""

import ast
import json
import os
import platform
import subprocess
import sys
import types

import pytest

from bertjax.records import hostmem

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc malloc")


@glibc
def test_tunables_are_wanted_only_when_asked_for_and_for_cpu_runs(monkeypatch):
  monkeypatch.setattr(hostmem, "accelerator_installed", lambda: False)
  tuned = {hostmem.SETTING: "tuned"}
  assert hostmem.wanted_tunables({"JAX_PLATFORMS": "cpu", **tuned}) == hostmem.TUNABLES
  assert hostmem.wanted_tunables(tuned) == hostmem.TUNABLES
  assert hostmem.wanted_tunables({"JAX_PLATFORMS": "cpu"}) is None  # auto: the model decides
  assert hostmem.wanted_tunables({}) is None
  # auto (unset or named): the tunables for hidden sizes of 256 or more.
  assert hostmem.TUNABLES == f"glibc.malloc.arena_max=1:{hostmem.KEEP_FREED}"
  for auto in ({}, {hostmem.SETTING: "auto"}):
    env = {"JAX_PLATFORMS": "cpu", **auto}
    assert hostmem.wanted_tunables(env, hidden_size=128) is None  # The demo's.
    assert hostmem.wanted_tunables(env, hidden_size=hostmem.AUTO_MIN_HIDDEN) == hostmem.TUNABLES
    assert hostmem.wanted_tunables(env, hidden_size=768) == hostmem.TUNABLES
  assert hostmem.wanted_tunables({"JAX_PLATFORMS": "cpu", **tuned}, hidden_size=128) == (
      hostmem.TUNABLES)
  assert hostmem.wanted_tunables({"JAX_PLATFORMS": "cpu", hostmem.SETTING: "default"},
                                 hidden_size=768) is None
  assert hostmem.wanted_tunables({"JAX_PLATFORMS": "tpu", **tuned}) is None
  assert hostmem.wanted_tunables({"JAX_PLATFORMS": "cuda,cpu", **tuned}) is None
  assert hostmem.wanted_tunables({"JAX_PLATFORMS": "cpu", hostmem.SETTING: "default"}) is None
  assert hostmem.wanted_tunables({"JAX_PLATFORMS": "cpu", "GLIBC_TUNABLES": hostmem.TUNABLES,
                                  **tuned}) is None
  other = "glibc.pthread.rseq=0"
  assert hostmem.wanted_tunables({"JAX_PLATFORMS": "cpu", "GLIBC_TUNABLES": other, **tuned}) == (
      f"{other}:{hostmem.TUNABLES}")
  with pytest.raises(ValueError, match="BERTJAX_HOST_MALLOC='on'"):
    hostmem.wanted_tunables({hostmem.SETTING: "on"})
  monkeypatch.setattr(hostmem, "accelerator_installed", lambda: True)
  assert hostmem.wanted_tunables(tuned) is None
  assert hostmem.wanted_tunables({"JAX_PLATFORMS": "cpu", **tuned}) == hostmem.TUNABLES


def _main(spec_name=None, path=None):
  """A stand-in for sys.modules["__main__"]."""
  main = types.SimpleNamespace(__spec__=types.SimpleNamespace(name=spec_name)
                               if spec_name else None)
  if path:
    main.__file__ = path
  return main


def test_the_entry_is_only_the_programs_own_command_line(tmp_path):
  entry = hostmem.entry_module
  py = "/venv/bin/python"
  main_py = "/src/bertjax/main.py"
  as_module = _main("bertjax.main", main_py)
  assert entry([py, "-m", "bertjax.main", "--workdir=w"], [main_py, "--workdir=w"],
               as_module) == "bertjax.main"
  assert entry([py, "-u", "-X", "dev", "-Wignore", "-m", "bertjax.main"], [main_py],
               as_module) == "bertjax.main"
  # Its arguments may look like the entry's; argv must be the tail of the command line.
  assert entry([py, "-m", "bertjax.main", "-m", "x"], [main_py, "-m", "x"],
               as_module) == "bertjax.main"
  # A test run and a notebook kernel are their own programs' command lines.
  assert entry([py, "-m", "pytest", "tests"], ["/venv/pytest", "tests"],
               _main("pytest")) == "pytest"
  assert entry([py, "-m", "ipykernel_launcher", "-f", "k.json"],
               ["/venv/ipykernel_launcher.py", "-f", "k.json"],
               _main("ipykernel_launcher")) == "ipykernel_launcher"
  # Under a debugger, from `python -c`.
  assert entry([py, "-m", "pdb", "-m", "bertjax.main"], [main_py], as_module) is None
  assert entry([py, "-c", "import bertjax.main"], ["-c"], _main()) is None
  # The command line names the module, but __main__ is another one.
  assert entry([py, "-m", "bertjax.main"], [main_py], _main("tool")) is None
  # sys.argv changed by the caller: not this process's command line.
  assert entry([py, "-c", "..."], ["bertjax-train", "--config=c.py"], _main()) is None
  script = str(tmp_path / "bertjax-train")
  assert entry([py, script, "--workdir=w"], [script, "--workdir=w"],
               _main(path=script)) == "bertjax.main"
  assert entry([py, script], [script], _main(path=str(tmp_path / "other"))) is None
  other = str(tmp_path / "run_bertjax.py")
  assert entry([py, other], [other], _main(path=other)) is None


def test_console_scripts_are_setup_pys_of_the_programs_that_reexecute():
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  with open(os.path.join(root, "setup.py"), encoding="utf-8") as f:
    tree = ast.parse(f.read())
  scripts = next(ast.literal_eval(node.value) for node in ast.walk(tree)
                 if isinstance(node, ast.keyword) and node.arg == "entry_points")
  reexecuting = {}
  for line in scripts["console_scripts"]:
    name, target = (part.strip() for part in line.split("="))
    module = target.split(":")[0]
    with open(os.path.join(root, *module.split(".")) + ".py", encoding="utf-8") as f:
      if f'hostmem.reexec_for_cpu("{module}")' in f.read():
        reexecuting[name] = module
  assert reexecuting == hostmem.CONSOLE_SCRIPTS


def test_the_environment_from_before_comes_back_after_the_reexecution():
  unset = {"PATH": "/bin", hostmem.TUNABLES_BEFORE: "stale"}
  env = hostmem.reexec_environ(unset, hostmem.TUNABLES)
  assert env["GLIBC_TUNABLES"] == hostmem.TUNABLES and hostmem.TUNABLES_BEFORE not in env
  hostmem.restore_environ(env)
  assert env == {"PATH": "/bin"}
  given = {"PATH": "/bin", "GLIBC_TUNABLES": "glibc.pthread.rseq=1"}
  env = hostmem.reexec_environ(given, "glibc.pthread.rseq=1:" + hostmem.TUNABLES)
  hostmem.restore_environ(env)
  assert env == given
  hostmem.restore_environ(given)  # Not a re-executed process: unchanged.
  assert given == {"PATH": "/bin", "GLIBC_TUNABLES": "glibc.pthread.rseq=1"}


# Reports, as one JSON line, what a command line's process ran with, then
# ends it: its process id; GLIBC_TUNABLES as the process started with it
# (what its malloc read) and as it now is in os.environ; the same in a
# subprocess and in a worker of a spawn pool (as data creation starts them)
# that it starts. First it calls the start-up again, which must not execute
# a second time.
_REPORT = """
import concurrent.futures, json, multiprocessing, os, subprocess, sys
from bertjax.records import hostmem

def report(spawn=False, **extra):
  hostmem.reexec_for_cpu(ENTRY)
  code = "import json, os; print(json.dumps(os.environ.get('GLIBC_TUNABLES')))"
  child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
  worker = "not run"
  if spawn:
    with concurrent.futures.ProcessPoolExecutor(
        1, mp_context=multiprocessing.get_context("spawn")) as pool:
      worker = pool.submit(os.getenv, "GLIBC_TUNABLES").result()
  print(json.dumps(dict(
      pid=os.getpid(), started_with=hostmem.tunables_at_start(),
      environ=os.environ.get("GLIBC_TUNABLES"),
      child=json.loads(child), worker=worker,
      carried=sorted(k for k in os.environ if k.startswith("BERTJAX_GLIBC")
                     or k == hostmem.REEXECUTED), **extra)), flush=True)
  os._exit(0)
"""

# A config file for the programs' --config: reports (above) instead of
# returning a config, after counting the minor page faults of a jitted
# gradient whose 640 x 30,592 logits (78 MB) are a temporary buffer, as the
# masked-LM decoder's are in a train step.
_PROBE_CONFIG = _REPORT + """
def page_faults():
  import resource
  import jax, jax.numpy as jnp
  f = jax.jit(jax.grad(lambda h, w: jax.nn.logsumexp(h @ w, -1).sum(), argnums=(0, 1)))
  h, w = jnp.ones((640, 256)), jnp.ones((256, 30592))
  for _ in range(12):  # until the heap stops growing
    jax.block_until_ready(f(h, w))
  counts = []
  for _ in range(7):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    jax.block_until_ready(f(h, w))
    counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
  return sorted(counts)[3]  # the median call

def get_config():
  report(spawn=SPAWN, faults=page_faults() if FAULTS else None)
"""


def _env(**overrides):
  env = {k: v for k, v in os.environ.items()
         if k not in ("GLIBC_TUNABLES", hostmem.SETTING, hostmem.REEXECUTED,
                      hostmem.TUNABLES_BEFORE)}
  env.update(JAX_PLATFORMS="cpu", **overrides)
  return env


def _run(argv, env):
  """Runs `argv`; returns its process id and its report."""
  proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)
  out, _ = proc.communicate(timeout=300)
  assert proc.returncode == 0, out
  reports = [line for line in out.splitlines() if line.startswith("{")]
  assert len(reports) == 1, out
  return proc.pid, json.loads(reports[0])


def _probe_config(tmp_path, entry, spawn=False, faults=False):
  path = tmp_path / f"probe_config_{spawn}_{faults}.py"
  path.write_text(f"ENTRY, SPAWN, FAULTS = {entry!r}, {spawn}, {faults}\n" + _PROBE_CONFIG)
  return str(path)


@pytest.mark.slow
@glibc
def test_a_cpu_process_reexecutes_itself_with_the_tunables_and_stops_page_faulting(tmp_path):
  config = _probe_config(tmp_path, "bertjax.benchmarks.step_bench", spawn=True, faults=True)
  pid, tuned = _run([sys.executable, "-m", "bertjax.benchmarks.step_bench", f"--config={config}"],
                    _env(**{hostmem.SETTING: "tuned"}))
  assert tuned["pid"] == pid  # the same process, executed again
  assert tuned["started_with"] == hostmem.TUNABLES
  # The processes it starts get the environment it was given.
  assert tuned["environ"] is None and tuned["child"] is None and tuned["worker"] is None
  assert tuned["carried"] == []
  config = _probe_config(tmp_path, "bertjax.benchmarks.step_bench", faults=True)
  _, default = _run([sys.executable, "-m", "bertjax.benchmarks.step_bench", f"--config={config}"],
                    _env())
  assert default["started_with"] is None  # Not asked for: glibc's defaults.
  # 78 MB is 19,000 pages of 4 KiB: with glibc's defaults each call maps its
  # temporaries afresh; with the tunables the freed blocks are reused.
  assert default["faults"] > 20_000
  assert tuned["faults"] < 1_000


_CONSOLE_SCRIPT = _REPORT + """
from bertjax.main import run  # what pip's console script does first
if __name__ == "__main__":
  report()
"""


@glibc
def test_the_console_script_reexecutes_and_its_children_get_the_tunables_it_was_given(
    tmp_path):
  script = tmp_path / "bertjax-train"
  script.write_text('ENTRY = "bertjax.main"\n' + _CONSOLE_SCRIPT)
  given = "glibc.pthread.rseq=1"
  pid, result = _run([sys.executable, str(script)],
                     _env(GLIBC_TUNABLES=given, **{hostmem.SETTING: "tuned"}))
  assert result["pid"] == pid
  assert result["started_with"] == f"{given}:{hostmem.TUNABLES}"
  assert result["environ"] == given and result["child"] == given
  assert result["carried"] == []


@glibc
def test_called_from_python_the_program_never_reexecutes(tmp_path):
  config = _probe_config(tmp_path, "bertjax.main")
  starts = tmp_path / "starts"
  code = (f"open({str(starts)!r}, 'a').write('start\\n')\n"
          "import sys\n"
          f"sys.argv = ['bertjax-train', '--config={config}']\n"
          "import bertjax.main\n"
          "bertjax.main.run()\n")
  pid, result = _run([sys.executable, "-c", code], _env(**{hostmem.SETTING: "tuned"}))
  assert starts.read_text() == "start\n"  # the caller's script ran once
  assert result["pid"] == pid and result["started_with"] is None


@glibc
def test_the_reexecuted_process_never_executes_again(tmp_path):
  # As if the environment of the re-execution had lost the tunables on the way.
  config = _probe_config(tmp_path, "bertjax.benchmarks.step_bench")
  argv = [sys.executable, "-m", "bertjax.benchmarks.step_bench", f"--config={config}"]
  pid, result = _run(argv, _env(**{hostmem.SETTING: "tuned", hostmem.REEXECUTED: "1",
                                   hostmem.TUNABLES_BEFORE: "glibc.pthread.rseq=1"}))
  assert result["pid"] == pid and result["started_with"] is None
  assert result["environ"] == "glibc.pthread.rseq=1" and result["carried"] == []


_AUTO_ENTRY = """
import json, os, sys
from bertjax.records import hostmem
hostmem.reexec_for_cpu("probe_entry")  # As the programs start.
hostmem.reexec_for_model("probe_entry", int(sys.argv[1]))  # Once they know the model.
print(json.dumps(dict(pid=os.getpid(), started_with=hostmem.tunables_at_start(),
                      environ=os.environ.get("GLIBC_TUNABLES"), describe=hostmem.describe())))
"""


@glibc
@pytest.mark.parametrize("hidden,setting,tuned", [
    (128, None, None), (256, None, "tunables"), (768, "auto", "tunables"),
    (768, "default", None), (128, "tuned", "tunables")])
def test_auto_reexecutes_once_the_model_is_known_and_only_for_a_large_one(
    tmp_path, hidden, setting, tuned):
  (tmp_path / "probe_entry.py").write_text(_AUTO_ENTRY)
  env = _env(**({hostmem.SETTING: setting} if setting else {}))
  env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
  pid, result = _run([sys.executable, "-m", "probe_entry", str(hidden)], env)
  assert result["pid"] == pid  # Re-executed or not, the same process.
  wanted = {"tunables": hostmem.TUNABLES, "keep_freed": hostmem.KEEP_FREED, None: None}
  assert result["started_with"] == wanted[tuned]
  assert result["environ"] is None  # Its children start as it was started.
  assert ("bertjax's tunables" in result["describe"]) == (tuned is not None)
  assert ("without the one arena" in result["describe"]) == (tuned == "keep_freed")
  assert f"{hostmem.SETTING}={setting or 'auto'}" in result["describe"]


def test_the_programs_ask_for_their_models_hidden_size_before_their_work():
  """main, finetune and step_bench call reexec_for_model with their model's hidden
  size first thing in main(); the fine-tuning size comes from init_from's checkpoint."""
  import inspect  # pylint: disable=g-import-not-at-top
  from bertjax import downstream  # pylint: disable=g-import-not-at-top
  for module, size in (("bertjax.main", "config.model.hidden_size"),
                       ("bertjax.finetune", "downstream.hidden_size("),
                       ("bertjax.benchmarks.step_bench", "_CONFIG.value.model.hidden_size")):
    source = open(os.path.join(os.path.dirname(os.path.dirname(__file__)),
                               *module.split(".")) + ".py").read()
    main = source[source.index("def main(argv):"):]
    call = main.index(f'reexec_for_model(')
    assert size in main[call:call + 200], module
    # Before the work starts: no distributed setup, training or benchmark before it.
    for later in ("distributed.initialize", "train_and_evaluate", "downstream.finetune(",
                  "run_benchmark("):
      assert later not in main[:call], (module, later)
  assert "checkpoint_settings" in inspect.getsource(downstream.hidden_size)
