"""sage_tfx.release: every exported name resolves to the class or function of its module, lazily, without TF."""

import subprocess
import sys

import sage_tfx.release as release


def test_every_export_resolves_to_its_module():
    for name in release.__all__:
        obj = getattr(release, name)
        assert obj.__module__ == f"sage_tfx.release.{release._EXPORTS[name]}", name
        assert obj.__name__ == name
    assert set(release.__all__) <= set(dir(release))


def test_unknown_name_is_an_attribute_error():
    try:
        release.NoSuchStrategy  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchStrategy" in str(exc)
    else:
        raise AssertionError("release.NoSuchStrategy resolved")


def test_importing_the_strategies_loads_no_tensorflow():
    code = (
        "import sys, sage_tfx.release as r\n"
        "[getattr(r, n) for n in r.__all__]\n"
        "assert 'tensorflow' not in sys.modules, 'tensorflow imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
