"""One settings module: every variable hpccoll reads is read and validated in ``hpccoll/_settings.py``."""

import ast
import pathlib

import pytest

import hpccoll
from hpccoll import _settings

PACKAGE = pathlib.Path(hpccoll.__file__).parent
#: The modules that may read the environment: the settings, the launcher's node-local rank facts, the info report.
READERS = {"_settings.py", "_local.py", "_info.py"}

GOOD = [
    ("HPCCOLL_CHECK", " Yes ", True),
    ("HPCCOLL_CHECK", "", False),
    ("HPCCOLL_DEBUG", "off", False),
    ("HPCCOLL_CUDA_AWARE_MPI", "", None),
    ("HPCCOLL_CUDA_AWARE_MPI", "1", True),
    ("HPCCOLL_TIMEOUT", "2.5", 2.5),
    ("HPCCOLL_TIMEOUT", "0", None),
    ("HPCCOLL_BUCKET_BYTES", "", _settings.DEFAULT_BUCKET_BYTES),
    ("HPCCOLL_BUCKET_BYTES", "4096", 4096),
    ("HPCCOLL_NODE_SIZE", "2,cyclic", (2, True)),
    ("HPCCOLL_NODE_SIZE", "3", (3, False)),
    ("HPCCOLL_NCCL_UNEVEN", "", "auto"),
    ("HPCCOLL_NCCL_UNEVEN", "pad", "pad"),
    ("HPCCOLL_TUNE_FILE", "/tmp/p.json", "/tmp/p.json"),
    ("XDG_CACHE_HOME", "/c", "/c"),
]
BAD = [
    ("HPCCOLL_CHECK", "maybe", "expected 1/true/yes/on or 0/false/no/off; got 'maybe'"),
    ("HPCCOLL_TIMEOUT", "-1", "expected a number of seconds >= 0 (0 or unset: no limit); got '-1'"),
    ("HPCCOLL_TIMEOUT", "inf", "got 'inf'"),
    ("HPCCOLL_BUCKET_BYTES", "1.5", "expected a positive int (bytes); got '1.5'"),
    ("HPCCOLL_NODE_SIZE", "2,ring", "expected a positive int (ranks per simulated node), optionally followed by"),
    ("HPCCOLL_NCCL_UNEVEN", "padded", "expected one of 'auto', 'grouped', 'pad'; got 'padded'"),
]


@pytest.mark.parametrize("name,text,want", GOOD)
def test_each_setting_parses_its_values(monkeypatch, name, text, want):
    monkeypatch.setenv(name, text)
    assert _settings.get(name) == want


@pytest.mark.parametrize("name,text,message", BAD)
def test_a_bad_value_names_the_variable_expected_and_got(monkeypatch, name, text, message):
    monkeypatch.setenv(name, text)
    with pytest.raises(hpccoll.ArgumentError, match=f"^{name}: ") as caught:
        _settings.get(name)
    assert message in str(caught.value)
    rows = {row[0]: row for row in _settings.report()}
    assert rows[name][1] == text and rows[name][2].startswith(f"invalid: {name}: ")


def test_report_lists_every_setting_once(monkeypatch):
    for name in _settings.SETTINGS:
        monkeypatch.delenv(name, raising=False)
    rows = _settings.report()
    assert [r[0] for r in rows] == list(_settings.SETTINGS) and all(r[1] == "(unset)" for r in rows)


def test_only_the_settings_module_reads_the_environment():
    """``os.environ`` and ``os.getenv`` appear in three modules only (issue 42: one owner of the settings)."""
    readers = set()
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb"):
                readers.add(str(path.relative_to(PACKAGE)))
    assert readers <= READERS, sorted(readers - READERS)
