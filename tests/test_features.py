"""The feature registry: every feature module imports, and backend mappings merge without two owners per leaf."""
import pytest

from primus.features import FEATURES, merged, modules


def test_every_feature_module_imports():
    assert [m.__name__.rsplit(".", 1)[1] for m in modules()] == list(FEATURES)


def test_merged_joins_sections_and_refuses_a_leaf_set_twice():
    assert merged([{"a": {"x": 1}}, {"a": {"y": 2}}, {"b": 3}]) == {"a": {"x": 1, "y": 2}, "b": 3}
    with pytest.raises(RuntimeError, match="'a.x'"):
        merged([{"a": {"x": 1}}, {"a": {"x": 1}}])
