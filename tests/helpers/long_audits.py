"""The marker of an audit longer than a suite can carry: it runs only with SAGE_LONG_AUDITS=1 (docs/testing.md)."""

import os

import pytest


def long_audit(why: str) -> pytest.MarkDecorator:
    """Skip unless ``SAGE_LONG_AUDITS`` is set; ``why`` says what makes the audit long."""
    return pytest.mark.skipif(
        not os.environ.get("SAGE_LONG_AUDITS"),
        reason=f"{why}: a long audit, run with SAGE_LONG_AUDITS=1 (docs/testing.md)",
    )
