"""Script assembly: each script gets exactly the _lib.lua helpers it uses."""

from __future__ import annotations

from durq.brokers.redis.lua import with_helpers

LIB = """-- lib header

-- a
local function a(x)
  return x
end

-- b uses a
local function b(x)
  return a(x) + 1
end

local K = 3
-- c (mentions b only in this comment)
local function c()
  return K
end
"""


def test_only_used_helpers_are_prepended_with_their_dependencies() -> None:
    source = with_helpers(LIB, "return b(1)\n")
    assert "local function a(" in source and "local function b(" in source
    assert "local function c(" not in source and "local K" not in source
    assert source.index("function a(") < source.index("function b(")


def test_a_name_in_a_comment_is_not_a_use() -> None:
    source = with_helpers(LIB, "-- calls b? no\nreturn c()\n")
    assert "local function c(" in source and "local K = 3" in source
    assert "local function b(" not in source
