"""The example table of syntax messages cannot go stale: each snippet yields its own label."""

import pytest

from loomc.syntax.diagnostics import LoomSyntaxError
from loomc.syntax.errors import SYNTAX_EXAMPLES
from loomc.syntax.parse import parse_module

CASES = [(code, message, snippet) for (code, message), snippets in SYNTAX_EXAMPLES.items() for snippet in snippets]


@pytest.mark.parametrize("code,message,snippet", CASES)
def test_example_produces_its_message(code, message, snippet):
    with pytest.raises(LoomSyntaxError) as info:
        parse_module(snippet, "example.loom")
    d = info.value.diagnostic
    assert d.code == code
    assert d.message.startswith(message)
