"""A stand-in for `gcloud` that plays a TPU slice on this machine.

launch/tpu_vm.sh is run with this program first on PATH as `gcloud`. Every
call is appended to WORLD/calls.jsonl. The slice is described by
WORLD/world.json:

  hosts            host names of the slice, e.g. ["host0", "host1"]
  nodes            for several slices: TPU VM name -> its hosts (instead of hosts)
  answering        hosts that answer ssh (default: all)
  slice_states     states returned by successive `describe` calls; the last repeats
                   (with nodes: a dict, TPU VM name -> its states)
  tpu_env          host -> the tpu-env metadata text its `curl` returns (default: empty)
  commits          host -> the commit its checkout reports
  unreachable_bucket  hosts for which `gcloud storage ls` fails
  rounds           per `train` start: {"exit": code, "summary": bool}
  qr_state_after_create  what a created queued resource reports (default ACTIVE)

`ssh --worker=all --command=C` runs C with bash once per host, with HOME set
to WORLD/hosts/HOST and stand-ins for hostname, git, tmux, sudo and pkill, so
the remote commands the launcher builds run for real. `tmux new-session -d`
runs its command at once, to completion. A host's `.venv/bin/python -m
bertjax.main ARGS` records ARGS in HOME/main_calls.jsonl, exits with the
current round's code and, when the round says so, writes the workdir's
summary.json; `python -c ...` runs the real interpreter. `tail -F` (the
`logs` subcommand) prints the log once instead of following it.
"""

import json
import os
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORLD = os.environ["FAKE_GCLOUD_WORLD"]

_STUBS = {
    "hostname": 'echo "$FAKE_HOST"\n',
    "git": ('if [ "$1" = rev-parse ]; then python3 -c \'import json,os,sys; '
            'w=json.load(open(os.environ["FAKE_GCLOUD_WORLD"]+"/world.json")); '
            'print(w["commits"][os.environ["FAKE_HOST"]])\'; fi\n'),
    "tmux": ('case "$1" in\n'
             '  has-session) [ -f "$HOME/tmux_running" ] ;;\n'
             '  new-session) shift 4; "$@" ;;\n'
             'esac\n'),
    "sudo": "true\n",
    "pkill": 'echo "$@" >> "$HOME/pkill_calls"\n',
    "curl": ('python3 -c \'import json,os; '
             'w=json.load(open(os.environ["FAKE_GCLOUD_WORLD"]+"/world.json")); '
             'print(w.get("tpu_env", {}).get(os.environ["FAKE_HOST"], ""))\'\n'),
}

_MAIN_STUB = """#!{python}
import json, os, sys
if sys.argv[1:2] != ["-m"]:
  os.execv({python!r}, [{python!r}] + sys.argv[1:])
home = os.environ["HOME"]
with open(os.path.join(home, "main_calls.jsonl"), "a") as f:
  f.write(json.dumps(sys.argv[1:]) + "\\n")
world = json.load(open(os.path.join(os.environ["FAKE_GCLOUD_WORLD"], "world.json")))
starts = open(os.path.join(os.environ["FAKE_GCLOUD_WORLD"], "train_starts")).read().count("x")
round_ = world["rounds"][min(starts, len(world["rounds"])) - 1]
if round_.get("summary"):
  workdir = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--workdir="))
  os.makedirs(workdir, exist_ok=True)
  open(os.path.join(workdir, "summary.json"), "w").write("{{}}")
print("training output of", os.environ["FAKE_HOST"])
sys.exit(round_["exit"])
"""


def _world():
  with open(os.path.join(WORLD, "world.json")) as f:
    return json.load(f)


def _set_world(world):
  with open(os.path.join(WORLD, "world.json"), "w") as f:
    json.dump(world, f)


def node_hosts(world, node):
  """The hosts of TPU VM `node`: world["nodes"][node], or world["hosts"] for one slice."""
  return world["nodes"][node] if "nodes" in world else world["hosts"]


def _flag(args, name):
  return next((a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")), None)


def install_host(host):
  """A host as `setup` leaves it: the repository's configs and a venv python."""
  home = os.path.join(WORLD, "hosts", host)
  shutil.rmtree(home, ignore_errors=True)
  os.makedirs(os.path.join(home, "bertjax", ".venv", "bin"))
  shutil.copytree(os.path.join(REPO, "configs"), os.path.join(home, "bertjax", "configs"))
  python = os.path.join(home, "bertjax", ".venv", "bin", "python")
  with open(python, "w") as f:
    f.write(_MAIN_STUB.format(python=sys.executable))
  os.chmod(python, 0o755)


def _stub_bin():
  directory = os.path.join(WORLD, "stubs")
  if not os.path.isdir(directory):
    os.makedirs(directory)
    for name, body in _STUBS.items():
      path = os.path.join(directory, name)
      with open(path, "w") as f:
        f.write("#!/usr/bin/env bash\n" + body)
      os.chmod(path, 0o755)
  return directory


def _ssh(args):
  world = _world()
  command = _flag(args, "command")
  node_hosts_ = node_hosts(world, args[4])
  if "git clone" in command:  # setup: the hosts get a fresh install.
    for host in node_hosts_:
      install_host(host)
    return 0
  if command.startswith("tail "):  # `logs` follows the log; here it prints it once.
    command = command.replace(" -F ", " ")
  if "tmux new-session" in command:
    with open(os.path.join(WORLD, "train_starts"), "a") as f:
      f.write("x")
  worker = _flag(args, "worker")
  hosts = node_hosts_ if worker == "all" else [node_hosts_[int(worker)]]
  answering = world.get("answering", [h for n in world.get("nodes", {"": world.get("hosts", [])}).values() for h in n])
  code = 0
  for host in hosts:
    if host not in answering:
      print(f"ssh: connect to host {host}: Connection timed out", file=sys.stderr)
      code = 255
      continue
    env = dict(os.environ, HOME=os.path.join(WORLD, "hosts", host), FAKE_HOST=host,
               PATH=f"{_stub_bin()}:{os.environ['PATH']}")
    result = subprocess.run(["bash", "-c", command], env=env, cwd=env["HOME"], check=False,
                            timeout=120)
    code = code or result.returncode
  return code


def main(args):
  with open(os.path.join(WORLD, "calls.jsonl"), "a") as f:
    f.write(json.dumps(args) + "\n")
  world = _world()
  if args[:2] == ["storage", "ls"]:
    return 1 if os.environ.get("FAKE_HOST") in world.get("unreachable_bucket", []) else 0
  if args[:2] == ["storage", "cp"]:
    return 0
  group, verb = args[2], args[3]
  if verb == "ssh":
    return _ssh(args)
  if verb == "describe":
    fmt = _flag(args, "format")
    if group == "queued-resources":
      print(world.get("qr_state", "ACTIVE"))
    elif fmt == "value(state)":
      per_node = isinstance(world["slice_states"], dict)
      states = world["slice_states"][args[4]] if per_node else world["slice_states"]
      print(states[0])
      if len(states) > 1:
        if per_node:
          world["slice_states"][args[4]] = states[1:]
        else:
          world["slice_states"] = states[1:]
        _set_world(world)
    else:
      print(";".join(f"10.0.0.{i}" for i, _ in enumerate(node_hosts(world, args[4]))))
    return 0
  if verb == "create":
    world["slice_states"] = ({n: ["READY"] for n in world["nodes"]} if "nodes" in world
                             else ["READY"])
    world["qr_state"] = world.get("qr_state_after_create", "ACTIVE")
    _set_world(world)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
