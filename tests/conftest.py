"""Fails the run, before any test, when a parity test's reference is missing.

The tests that compare bertjax with the original BERT release
(bert-tensorflow), Hugging Face transformers and Apache Beam carry the
README's claims, so a missing reference is an error, not a reason to skip
them. `pip install -e ".[test,beam]"` installs all three.
"""

import importlib.util

import pytest

# (module, what to install).
REFERENCES = (
    ("bert.create_pretraining_data",
     "bert-tensorflow==1.0.4 (the original BERT release)"),
    ("transformers", "transformers"),
    ("apache_beam", "apache-beam"),
)


def missing_references() -> list[str]:
  missing = []
  for module, package in REFERENCES:
    try:
      found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # Its parent package is missing.
      found = False
    if not found:
      missing.append(package)
  return missing


def pytest_configure(config):  # pylint: disable=unused-argument
  missing = missing_references()
  if missing:
    raise pytest.UsageError(
        f"the parity tests' references are not installed: "
        f"{', '.join(missing)}. Install them with "
        "`pip install -e \".[test,beam]\"`; these tests are not skipped.")
