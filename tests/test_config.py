import re

import pytest

from pystrads.config import DEFAULTS, PREFIX, Config
from pystrads.errors import ConfigurationError


def test_reference_file_lists_every_key_with_its_default_and_a_comment():
    text = open("conf/pystrads-defaults.conf").read()
    found = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^(spark\.pystrads\.\S+)\s+(.*)$", line)
        if m:
            assert lines[i - 1].startswith("#"), f"{m.group(1)} has no comment"
            found[m.group(1)[len(PREFIX):]] = m.group(2)
    assert set(found) == set(DEFAULTS)
    for key, value in found.items():
        if key != "shard.heartbeatSeconds":  # 0 = automatic, resolved to a number
            assert Config.resolve({PREFIX + key: value})[key] == DEFAULTS[key]


def test_bad_values_name_the_key_and_the_fix():
    with pytest.raises(ConfigurationError, match=r"spark\.pystrads\.shard\.leaseSeconds.*below its minimum"):
        Config.resolve({"spark.pystrads.shard.leaseSeconds": "0"})
    with pytest.raises(ConfigurationError, match="not a valid int"):
        Config.resolve(overrides={"rpc.chunkBytes": "lots"})
    with pytest.raises(ConfigurationError, match="unknown setting spark.pystrads.nope"):
        Config.resolve({"spark.pystrads.nope": "1"})
    with pytest.raises(ConfigurationError, match="heartbeatSeconds"):
        Config.resolve(overrides={"shard.leaseSeconds": 2, "shard.heartbeatSeconds": 1.5})
    resolved = Config.resolve(overrides={"shard.leaseSeconds": 5})
    assert resolved["shard.leaseSeconds"] == 5.0 and resolved["shard.heartbeatSeconds"] == 1.0
