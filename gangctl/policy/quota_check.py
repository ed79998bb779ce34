"""Check a quota policy file's text: schema and semantic errors, each naming the field and its line.

Pure: the caller reads the file and passes its text. The schema is `QuotaPolicy` (policies/schema.json
is generated from it), so a file valid here is one the simulator and `policy apply` accept.
"""
from __future__ import annotations

from dataclasses import dataclass

import yaml
from pydantic import ValidationError

from gangctl.model.quota import QuotaPolicy


@dataclass(frozen=True)
class Problem:
    path: str     # e.g. "teams[1].lendingLimit.gpu" ("" for the whole file)
    line: int     # 1-based; 0 when unknown
    message: str

    def format(self, filename: str) -> str:
        where = f"{filename}:{self.line}" if self.line else filename
        return f"{where}: {self.path + ': ' if self.path else ''}{self.message}"


def _path(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _line_of(root: yaml.Node | None, loc: tuple) -> int:
    """The line of the deepest node of `loc` that exists in the YAML (keys are the file's camelCase)."""
    node, line = root, (root.start_mark.line + 1) if root is not None else 0
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next(((k, v) for k, v in node.value if getattr(k, "value", None) == part), None)
            if match is None:
                break
            line = match[0].start_mark.line + 1
            node = match[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line


def check_policy(text: str) -> tuple[QuotaPolicy | None, list[Problem]]:
    """The policy, or None and every problem found."""
    try:
        root = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        return None, [Problem("", mark.line + 1 if mark else 0, f"not valid YAML: {getattr(exc, 'problem', exc)}")]
    if not isinstance(data, dict):
        return None, [Problem("", 1, "expected a mapping with `teams` (and optionally `priorities`, `defaultPriority`)")]
    try:
        return QuotaPolicy.model_validate(data), []
    except ValidationError as exc:
        problems = []
        for e in exc.errors():
            loc = tuple(p for p in e["loc"] if p not in ("function-after[_limits_need_cohort(), Team]",))
            message = e["msg"].removeprefix("Value error, ")
            problems.append(Problem(_path(loc), _line_of(root, loc), message))
        return None, problems
