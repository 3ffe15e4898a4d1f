"""The reference renderer of data's chat-template tests: Jinja2 set up as
Hugging Face's apply_chat_template sets it up (trim_blocks, lstrip_blocks,
loop controls, an immutable sandbox, raise_exception, its tojson), without
strftime_now (Strata leaves it out so that data does not depend on the day).

stdin: a JSON list of {"template", "vars"}; stdout: a JSON list of
{"out": TEXT} or {"error": MESSAGE}, one per case."""
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

out = []
for case in json.load(sys.stdin):
    try:
        out.append({"out": env.from_string(case["template"]).render(**case["vars"])})
    except Exception as e:  # noqa: BLE001 - any failure is the answer
        out.append({"error": f"{type(e).__name__}: {e}"})
json.dump(out, sys.stdout)
