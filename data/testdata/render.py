"""The reference renderer of data's chat-template tests: Jinja2 set up as
Hugging Face's apply_chat_template sets it up (trim_blocks, lstrip_blocks,
loop controls, an immutable sandbox, raise_exception, its tojson), with
strftime_now only where a case gives the time it answers with ("now": an
ISO 8601 time; Strata leaves it out of training data, which would then
depend on the day).

stdin: a JSON list of {"template", "vars", "now"?}; stdout: a JSON list of
{"out": TEXT} or {"error": MESSAGE}, one per case."""
import datetime
import json
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class Generation(jinja2.ext.Extension):
    """{% generation %}...{% endgeneration %}: rendered as is."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception


def strftime_now_at(now):
    """transformers' strftime_now (datetime.now().strftime), at a given time."""
    t = datetime.datetime.fromisoformat(now)
    return lambda format: t.strftime(format)


out = []
for case in json.load(sys.stdin):
    try:
        variables = dict(case["vars"])
        if case.get("now"):
            variables["strftime_now"] = strftime_now_at(case["now"])
        out.append({"out": env.from_string(case["template"]).render(**variables)})
    except Exception as e:  # noqa: BLE001 - any failure is the answer
        out.append({"error": f"{type(e).__name__}: {e}"})
json.dump(out, sys.stdout)
