"""What a fuzz run over /openapi.json holds the server to, beyond "every answer matches the document": the
requests the document allows are the requests the routes serve. Per operation, positive-mode cases (requests
valid against the document) are tallied by status; a route that refuses (4xx) more than MAX_REFUSED of them
has a document looser than its validation, and a 5xx the operation does not declare (its 501 where this
configuration does not serve it) is a fault."""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import schemathesis
from hypothesis import HealthCheck, Phase, given, settings

# Inputs are also bounded in tokens, which no schema can say (a generated text may run past -ub): a few refusals
MAX_REFUSED = 0.25
# Their 400s depend on what is loaded (load: already running; unload: not running), not on the request alone
STATEFUL = frozenset({("post", "/models/load"), ("post", "/models/unload")})

Tallies = dict[tuple[str, str], Counter]


def declared(document: dict, method: str, path: str) -> set[str]:
    """The statuses an operation declares, `default` aside."""
    return set(document["paths"][path][method]["responses"]) - {"default"}


def declared_server_error(document: dict, case: schemathesis.Case, status: int) -> bool:
    return str(status) in declared(document, case.operation.method.lower(), case.operation.path)


def tally_positive_cases(api_schema: schemathesis.BaseSchema, call: Callable[[schemathesis.Case], int],
                         examples: int) -> Tallies:
    """Each operation's positive-mode cases through `call` (which answers the status), counted by status."""
    tallies: Tallies = {}
    for result in api_schema.get_all_operations():
        operation = result.ok()
        statuses = tallies.setdefault((operation.method.lower(), operation.path), Counter())

        @given(case=operation.as_strategy(generation_mode=schemathesis.GenerationMode.POSITIVE))
        @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                  phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
        def run(case: schemathesis.Case) -> None:
            statuses[call(case)] += 1

        run()
    return tallies


def problems(document: dict, tallies: Tallies) -> list[str]:
    """Operations that refuse too many of the requests their document allows, or answer an undeclared 5xx."""
    found = []
    for (method, path), statuses in sorted(tallies.items()):
        responses = declared(document, method, path)
        total = sum(statuses.values())
        faults = {status: n for status, n in statuses.items() if status >= 500 and str(status) not in responses}
        refused = sum(n for status, n in statuses.items() if 400 <= status < 500)
        if faults:
            found.append(f"{method.upper()} {path}: undeclared server errors {faults} of {total}")
        if "200" in responses and (method, path) not in STATEFUL and total and refused / total > MAX_REFUSED:
            found.append(f"{method.upper()} {path}: {refused} of {total} valid requests refused {dict(statuses)}")
    return found


def refused_shares(tallies: Tallies) -> dict[str, float]:
    """Per operation, the share of its positive cases answered 4xx (for reports)."""
    return {f"{method.upper()} {path}": round(sum(n for s, n in statuses.items() if 400 <= s < 500)
                                              / max(1, sum(statuses.values())), 2)
            for (method, path), statuses in sorted(tallies.items())}
