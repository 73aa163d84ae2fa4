import pytest

from codekv.eval.scores import first_line, identifier_f1, identifiers, normalise, score


def test_exact_match_ignores_whitespace_only():
    assert score("  return   x+1\n", "return x+1").exact_match
    assert not score("return x + 1", "return x+1").exact_match
    assert normalise(" a\t b \n c ") == "a b c"


def test_edit_similarity_hand_checked():
    # 'return x' vs 'return y + 1': longest common subsequence 'return ' (7 of 8 + 12 chars).
    assert score("return x", "return y + 1").edit_similarity == pytest.approx(70.0)
    assert score("abcd", "abce").edit_similarity == pytest.approx(75.0)
    assert score("same", "same").edit_similarity == 100.0


def test_identifier_f1_hand_checked():
    assert identifiers("if self.items: return self.items[0]") == {"self": 2, "items": 2}
    # predicted {x, foo}, expected {x, bar, baz}: 1 common, P 1/2, R 1/3, F1 0.4
    assert identifier_f1("x = foo()", "x = bar(baz)") == pytest.approx(0.4)
    assert identifier_f1("pass", "return") == 1.0  # keywords only on both sides
    assert identifier_f1("a", "") == 0.0


def test_completion_scored_on_its_first_line():
    generated = "\n    total = count(items)\n    return total\n"
    assert first_line(generated) == "    total = count(items)"
    result = score(generated, "total = count(items)\n", one_line=True)
    assert result.exact_match and result.identifier_f1 == 1.0
    assert not score(generated, "total = count(items)").exact_match
