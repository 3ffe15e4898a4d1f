package jinja

import (
	"fmt"
	"slices"
)

// Macros: {% macro name(a, b=default) %}body{% endmacro %}, called as a
// function that renders its body and returns the text (a str: Hugging
// Face renders without autoescape, so not Markup). As in Jinja2, a
// parameter not given and without a default is undefined, a default is
// evaluated at each call after the parameters before it are bound, the
// body sees the variables of where the macro was defined as they are
// when it is called (the template's top level, a loop's iteration), and
// what it sets stays inside the call. A macro's varargs, kwargs and
// caller (and {% call %} blocks) are not built: a body naming them is
// refused when the template is parsed.

// maxMacroDepth bounds macro calls inside macro calls (a macro calling
// itself): Jinja2 stops near it at Python's recursion limit, and past it
// the rendering is an error, not a stack overflow.
const maxMacroDepth = 100

// macroUnbuilt are the names a macro's body may use in Jinja2 that the
// interpreter does not give it.
var macroUnbuilt = []string{"varargs", "kwargs", "caller"}

func (p *tmplParser) parseMacro(it *tmplItem) (tmplNode, error) {
	ep := &exprParser{toks: it.toks[1:], line: it.lineNo}
	n := &macroNode{line: it.lineNo}
	t := ep.next()
	if t.kind != 'n' {
		return nil, ep.errorf("expected the macro's name, got %s", t)
	}
	n.name = t.s
	if !ep.accept('o', "(") {
		return nil, ep.errorf("expected ( after the macro's name")
	}
	args, kw, err := ep.parseArgs()
	if err != nil {
		return nil, err
	}
	if !ep.done() {
		return nil, ep.errorf("unexpected %s in the macro tag", ep.peek())
	}
	for _, a := range args {
		name, ok := a.(*nameExpr)
		if !ok {
			return nil, fmt.Errorf("line %d: a macro's parameter must be a name", it.lineNo)
		}
		n.params, n.defaults = append(n.params, name.name), append(n.defaults, nil)
	}
	for _, k := range kw {
		n.params, n.defaults = append(n.params, k.name), append(n.defaults, k.x)
	}
	for i, a := range n.params {
		if slices.Contains(n.params[:i], a) {
			return nil, fmt.Errorf("line %d: macro %s has two parameters named %s", it.lineNo, n.name, a)
		}
	}
	start := p.pos
	body, end, err := p.body()
	if err != nil {
		return nil, err
	}
	if end == nil || end.toks[0].s != "endmacro" {
		return nil, fmt.Errorf("line %d: {%% macro %%} without {%% endmacro %%}", it.lineNo)
	}
	for _, in := range p.items[start : p.pos-1] {
		for _, t := range in.toks {
			if t.kind == 'n' && slices.Contains(macroUnbuilt, t.s) && !slices.Contains(n.params, t.s) {
				return nil, fmt.Errorf("line %d: a macro's %s is not supported (Strata's macros take their named parameters)", in.lineNo, t.s)
			}
		}
	}
	n.body = body
	return n, nil
}

// defineMacro defines a macro in the current scope, seeing the scopes of
// where it is defined.
func (r *renderer) defineMacro(n *macroNode) {
	defined := slices.Clone(r.scopes)
	m := &fn{name: n.name, macro: true}
	m.call = func(b *budget, args []any, kw *dict) (any, error) {
		if len(args) > len(n.params) {
			return nil, fmt.Errorf("macro '%s' takes not more than %d argument(s)", n.name, len(n.params))
		}
		if b.macroDepth++; b.macroDepth > maxMacroDepth {
			return nil, fmt.Errorf("macro '%s': macros called more than %d deep", n.name, maxMacroDepth)
		}
		defer func() { b.macroDepth-- }()
		local := map[string]any{}
		sub := &renderer{bud: b, out: text{bud: b}, scopes: append(slices.Clone(defined), local)}
		for _, k := range kw.keys {
			i := slices.Index(n.params, k)
			if i < 0 || i < len(args) { // Jinja2's message for both
				return nil, fmt.Errorf("macro '%s' takes no keyword argument '%s'", n.name, k)
			}
		}
		for i, p := range n.params {
			v, given := kw.get(p)
			switch {
			case i < len(args):
				v = args[i]
			case given:
			case n.defaults[i] != nil:
				var err error
				if v, err = sub.eval(n.defaults[i]); err != nil {
					return nil, fmt.Errorf("macro '%s': the default of %s: %w", n.name, p, err)
				}
			default:
				v = undef{fmt.Sprintf("%q is undefined (macro '%s' was not given it)", p, n.name)}
			}
			local[p] = v
		}
		if err := sub.exec(n.body); err != nil {
			return nil, fmt.Errorf("in macro '%s': %w", n.name, err)
		}
		return sub.out.String(), nil
	}
	r.scopes[len(r.scopes)-1][n.name] = m
}
