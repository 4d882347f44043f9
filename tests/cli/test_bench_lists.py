"""`sage bench ...` options that take a comma list: a bad item is refused by argparse (usage, exit 2), naming the
option, the item and the fix, before the benchmark does any work."""

import argparse
import importlib
import os
import pkgutil

import pytest

import sage_tfx.bench as benches
from sage_tfx import comma_lists
from sage_tfx.cli import main

LIST_TYPES = (comma_lists.counts, comma_lists.names, comma_lists.numbers, comma_lists.positive_numbers)


def _bench_modules():
    return [info.name for info in pkgutil.iter_modules(benches.__path__) if not info.name.startswith("_")]


def _refused(capsys, argv):
    """Run `sage ARGV` in this process: argparse's exit code and what it printed to stderr."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    return exc.value.code, capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, item, fix",
    [
        (["bench", "incremental-regression", "--horizons", "8,,16"], "an empty item", "whole numbers >= 1"),
        (["bench", "incremental-regression", "--horizons", "8,x"], "'x' is not a whole number", "e.g. 8,16,32"),
        (["bench", "scale", "--serve-parallel", "2,-1"], "'-1' is not a whole number >= 1", "whole numbers >= 1"),
        (["bench", "noise", "--sizes", "100,1.5"], "'1.5' is not a whole number", "whole numbers >= 1"),
        (["bench", "validation", "--by-epsilon", "0.5,0"], "'0' is not a finite number > 0", "numbers > 0"),
        (["bench", "sample-complexity", "--epsilons", "-1"], "'-1' is not a finite number > 0", "numbers > 0"),
        (["bench", "block-composition", "--fractions", "0.5,half"], "'half' is not a finite number", "e.g. 0.5,0.9"),
        (["bench", "dp-sgd", "--implementations", "ghost,"], "an empty item is not a name", "names separated"),
    ],
)
def test_a_bad_list_item_is_a_usage_error_naming_the_option_the_item_and_the_fix(capsys, argv, item, fix):
    code, err = _refused(capsys, argv)
    assert code == 2
    assert err.startswith("usage: sage bench") and f"argument {argv[2]}: {argv[3]!r}: {item}" in err and fix in err


def test_a_bad_writer_count_stops_the_ledger_bench_before_it_makes_a_database(capsys, tmp_path):
    db_dir = tmp_path / "ledger_bench"
    code, err = _refused(capsys, ["bench", "ledger", "--writers", "1,0", "--db-dir", str(db_dir)])
    assert code == 2 and "argument --writers: '1,0': '0' is not a whole number >= 1" in err
    assert not os.path.exists(db_dir)


@pytest.mark.parametrize("name", _bench_modules())
def test_every_bench_option_with_a_comma_list_default_parses_it_with_comma_lists(name):
    module = importlib.import_module(f"sage_tfx.bench.{name}")
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    for action in parser._actions:
        if isinstance(action.default, str) and "," in action.default:
            assert action.type in LIST_TYPES, f"sage bench {name} {action.option_strings[0]} splits its list by hand"
