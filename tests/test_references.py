"""The test run fails, rather than skipping tests, without a reference."""

import subprocess
import sys

import pytest

import conftest

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("module,package", conftest.REFERENCES)
def test_a_missing_reference_fails_the_run(module, package):
  hide = f"import sys; sys.modules[{module!r}] = None; "
  hide += "import pytest; sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider',"
  hide += " '--collect-only', 'tests/test_references.py']))"
  result = subprocess.run([sys.executable, "-c", hide], capture_output=True,
                          text=True, timeout=300, check=False)
  assert result.returncode != 0
  assert "references are not installed: " + package in (
      result.stdout + result.stderr)

