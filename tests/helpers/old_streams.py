"""A stream stored the way an older sage stored it: made with the filter of that version, its column dropped and
the ledger's schema version set back, then upgraded by ``sage ledger upgrade``'s path (``migrations.upgrade``), as
an operator brings an old ledger to this version (tests of the rdp rules); and an rdp grant made, or released
under, the way an older sage did."""

import sqlite3

from sage_tfx.privacy import Ledger, filters, grants
from sage_tfx.privacy import ledger as ledger_module


def stream_stored_before(path, monkeypatch, version, column, old_filter, name, epsilon, delta):
    """Make rdp stream ``name`` at ``path`` with ``old_filter(real_make_filter, *args)`` as the filter, then drop
    ``column``, set the schema version to ``version`` and upgrade the ledger."""
    from sage_tfx.privacy import streams as streams_module

    real = filters.make_filter
    with monkeypatch.context() as m:
        m.setattr(streams_module.filters, "make_filter", lambda *a, **k: old_filter(real, *a))
        with Ledger.open(path, create=True) as ledger:
            ledger.create_stream(name, epsilon, delta, accounting="rdp")
    conn = sqlite3.connect(path)
    conn.execute(f"ALTER TABLE streams DROP COLUMN {column}")
    conn.execute(f"UPDATE meta SET value = '{version}' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    Ledger.upgrade(path, progress=lambda line: None)


def rdp_grant_made_before(ledger, monkeypatch, *args, **kwargs):
    """``ledger.request(*args, **kwargs)`` on an rdp stream as sage made grants before they recorded what was asked:
    the grant's epsilon is its charge converted at the stream's delta, and its body has no ``converted_epsilon``."""
    with monkeypatch.context() as m:
        m.setattr(grants, "grant_budget", lambda filt, cost: (filt.query_epsilon(cost), cost[0], None))
        return ledger.request(*args, **kwargs)


def release_as_before(ledger, monkeypatch, *args, **kwargs):
    """``ledger.release(*args, **kwargs)`` as sage released before it capped such grants: an rdp grant without
    ``converted_epsilon`` let its stages spend its recorded (converted) epsilon."""
    with monkeypatch.context() as m:
        m.setattr(ledger_module, "older_rdp", lambda grant: False)
        return ledger.release(*args, **kwargs)
