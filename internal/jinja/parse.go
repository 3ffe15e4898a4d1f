package jinja

import (
	"fmt"
	"strconv"
	"strings"
)

// The parser of the chat-template interpreter: statements (text, {{ }},
// if/elif/else, for/else with loop filters, set, block set, break,
// continue, generation, macro) and Jinja's expression grammar with its
// operator precedence (or, and, not, comparisons and in, + -, ~, * / //
// %, **, unary - +, then postfix . [] () and filters | and tests is).

// tmplNode is a statement of a parsed template.
type tmplNode interface{}

type (
	textNode struct{ s string }
	outNode  struct {
		x    expr
		line int
	}
	ifNode struct {
		conds  []expr
		bodies [][]tmplNode
		els    []tmplNode
	}
	forNode struct {
		vars      []string
		iter, cnd expr
		body, els []tmplNode
		line      int
	}
	setNode struct {
		name, attr string // attr: set name.attr = x (a namespace)
		names      []string
		x          expr
		body       []tmplNode // block set: {% set name %}body{% endset %}
		line       int
	}
	breakNode    struct{}
	continueNode struct{}
	// macroNode is {% macro name(params) %}body{% endmacro %}
	// (macro.go).
	macroNode struct {
		name     string
		params   []string
		defaults []expr // per parameter, nil: none
		body     []tmplNode
		line     int
	}
)

// expr is an expression; eval is in eval.go.
type expr interface{}

type (
	litExpr  struct{ v any }
	nameExpr struct{ name string }
	attrExpr struct {
		x    expr
		name string
	}
	indexExpr struct{ x, i expr }
	sliceExpr struct{ x, lo, hi, step expr }
	callExpr  struct {
		fn   expr
		args []expr
		kw   []kwArg
	}
	filterExpr struct {
		x    expr
		name string
		args []expr
		kw   []kwArg
	}
	testExpr struct {
		x    expr
		name string
		args []expr
		not  bool
	}
	binExpr struct {
		op   string
		a, b expr
	}
	unExpr struct {
		op string
		x  expr
	}
	condExpr struct{ cond, a, b expr }
	listExpr struct {
		items []expr
		tuple bool
	}
	dictExpr struct{ keys, vals []expr }
	kwArg    struct {
		name string
		x    expr
	}
)

// tmplParser parses the items of a template.
type tmplParser struct {
	items []tmplItem
	pos   int
	depth int // nested blocks: bounded (maxNesting)
}

// parseTemplate parses a template's source.
func parseTemplate(src string) ([]tmplNode, error) {
	items, err := lexTemplate(src)
	if err != nil {
		return nil, err
	}
	p := &tmplParser{items: items}
	body, end, err := p.body()
	if err != nil {
		return nil, err
	}
	if end != nil {
		return nil, fmt.Errorf("line %d: unexpected {%% %s %%}", end.lineNo, end.toks[0].s)
	}
	return body, nil
}

// body parses statements up to a block tag that ends or splits a block
// (else, elif, endif, endfor, endset, endgeneration, endmacro), which it returns
// unconsumed-but-read; nil at the end of the template.
func (p *tmplParser) body() ([]tmplNode, *tmplItem, error) {
	if p.depth++; p.depth > maxNesting {
		line := 0
		if p.pos > 0 { // the block's tag
			line = p.items[p.pos-1].lineNo
		}
		return nil, nil, fmt.Errorf("line %d: blocks nested more than %d deep", line, maxNesting)
	}
	defer func() { p.depth-- }()
	var out []tmplNode
	for p.pos < len(p.items) {
		it := &p.items[p.pos]
		p.pos++
		switch it.kind {
		case 't':
			out = append(out, textNode{it.text})
			continue
		case 'v':
			ep := &exprParser{toks: it.toks, line: it.lineNo}
			x, err := ep.whole()
			if err != nil {
				return nil, nil, err
			}
			out = append(out, outNode{x: x, line: it.lineNo})
			continue
		}
		if len(it.toks) == 0 || it.toks[0].kind != 'n' {
			return nil, nil, fmt.Errorf("line %d: a block tag must start with a name", it.lineNo)
		}
		switch name := it.toks[0].s; name {
		case "else", "elif", "endif", "endfor", "endset", "endgeneration", "endmacro":
			return out, it, nil
		case "if":
			n, err := p.parseIf(it)
			if err != nil {
				return nil, nil, err
			}
			out = append(out, n)
		case "for":
			n, err := p.parseFor(it)
			if err != nil {
				return nil, nil, err
			}
			out = append(out, n)
		case "set":
			n, err := p.parseSet(it)
			if err != nil {
				return nil, nil, err
			}
			out = append(out, n)
		case "macro":
			n, err := p.parseMacro(it)
			if err != nil {
				return nil, nil, err
			}
			out = append(out, n)
		case "break", "continue":
			if len(it.toks) != 1 {
				return nil, nil, fmt.Errorf("line %d: {%% %s %%} takes nothing", it.lineNo, name)
			}
			if name == "break" {
				out = append(out, breakNode{})
			} else {
				out = append(out, continueNode{})
			}
		case "generation":
			// Hugging Face's marker of the assistant's text: rendered as is.
			inner, end, err := p.body()
			if err != nil {
				return nil, nil, err
			}
			if end == nil || end.toks[0].s != "endgeneration" {
				return nil, nil, fmt.Errorf("line %d: {%% generation %%} without {%% endgeneration %%}", it.lineNo)
			}
			out = append(out, inner...)
		default:
			return nil, nil, fmt.Errorf("line %d: {%% %s %%} is not supported (Strata renders if, for, set, macro, break, continue and generation blocks)", it.lineNo, name)
		}
	}
	return out, nil, nil
}

func (p *tmplParser) parseIf(it *tmplItem) (tmplNode, error) {
	n := &ifNode{}
	cur := it
	for {
		ep := &exprParser{toks: cur.toks[1:], line: cur.lineNo}
		c, err := ep.whole()
		if err != nil {
			return nil, err
		}
		body, end, err := p.body()
		if err != nil {
			return nil, err
		}
		n.conds, n.bodies = append(n.conds, c), append(n.bodies, body)
		if end == nil {
			return nil, fmt.Errorf("line %d: {%% if %%} without {%% endif %%}", it.lineNo)
		}
		switch end.toks[0].s {
		case "elif":
			cur = end
			continue
		case "else":
			if n.els, end, err = p.body(); err != nil {
				return nil, err
			}
			if end == nil || end.toks[0].s != "endif" {
				return nil, fmt.Errorf("line %d: {%% if %%} without {%% endif %%}", it.lineNo)
			}
			return n, nil
		case "endif":
			return n, nil
		}
		return nil, fmt.Errorf("line %d: unexpected {%% %s %%} in an if block", end.lineNo, end.toks[0].s)
	}
}

func (p *tmplParser) parseFor(it *tmplItem) (tmplNode, error) {
	ep := &exprParser{toks: it.toks[1:], line: it.lineNo}
	n := &forNode{line: it.lineNo}
	for {
		t := ep.next()
		if t.kind != 'n' {
			return nil, ep.errorf("expected a loop variable, got %s", t)
		}
		n.vars = append(n.vars, t.s)
		if !ep.accept('o', ",") {
			break
		}
	}
	if !ep.accept('n', "in") {
		return nil, ep.errorf("expected \"in\" in the for tag")
	}
	var err error
	if n.iter, err = ep.parseOr(); err != nil { // no inline if: "if" filters the loop
		return nil, err
	}
	if ep.accept('n', "if") {
		if n.cnd, err = ep.parseOr(); err != nil {
			return nil, err
		}
	}
	if !ep.done() {
		return nil, ep.errorf("unexpected %s in the for tag", ep.peek())
	}
	body, end, err := p.body()
	if err != nil {
		return nil, err
	}
	n.body = body
	if end != nil && end.toks[0].s == "else" {
		if n.els, end, err = p.body(); err != nil {
			return nil, err
		}
	}
	if end == nil || end.toks[0].s != "endfor" {
		return nil, fmt.Errorf("line %d: {%% for %%} without {%% endfor %%}", it.lineNo)
	}
	return n, nil
}

func (p *tmplParser) parseSet(it *tmplItem) (tmplNode, error) {
	ep := &exprParser{toks: it.toks[1:], line: it.lineNo}
	n := &setNode{line: it.lineNo}
	t := ep.next()
	if t.kind != 'n' {
		return nil, ep.errorf("expected a name after set, got %s", t)
	}
	n.name = t.s
	switch {
	case ep.accept('o', "."):
		a := ep.next()
		if a.kind != 'n' {
			return nil, ep.errorf("expected an attribute name, got %s", a)
		}
		n.attr = a.s
	case ep.peek().s == ",":
		n.names = []string{n.name}
		for ep.accept('o', ",") {
			a := ep.next()
			if a.kind != 'n' {
				return nil, ep.errorf("expected a name, got %s", a)
			}
			n.names = append(n.names, a.s)
		}
	}
	if ep.done() && n.attr == "" && n.names == nil {
		body, end, err := p.body()
		if err != nil {
			return nil, err
		}
		if end == nil || end.toks[0].s != "endset" {
			return nil, fmt.Errorf("line %d: {%% set %s %%} without {%% endset %%}", it.lineNo, n.name)
		}
		n.body = body
		return n, nil
	}
	if !ep.accept('o', "=") {
		return nil, ep.errorf("expected = in the set tag")
	}
	var err error
	if n.x, err = ep.whole(); err != nil {
		return nil, err
	}
	return n, nil
}

// exprParser parses the tokens of one tag.
type exprParser struct {
	toks  []tok
	pos   int
	line  int
	depth int // nested calls of unary and parseNot: bounded (maxNesting)
}

// maxNesting bounds how deep a template's blocks, and an expression's
// brackets, signs and "not"s, nest: a deeper one is refused, not a stack
// overflow (Jinja2 refuses about 100 of either).
const maxNesting = 200

func (e *exprParser) errorf(format string, args ...any) error {
	return fmt.Errorf("line %d: %s", e.line, fmt.Sprintf(format, args...))
}

func (e *exprParser) peek() tok {
	if e.pos < len(e.toks) {
		return e.toks[e.pos]
	}
	return tok{kind: 0, s: "the end of the tag"}
}

func (e *exprParser) next() tok {
	t := e.peek()
	if e.pos < len(e.toks) {
		e.pos++
	}
	return t
}

func (e *exprParser) done() bool { return e.pos >= len(e.toks) }

// accept consumes the next token when it is kind k and text s.
func (e *exprParser) accept(k byte, s string) bool {
	if t := e.peek(); t.kind == k && t.s == s {
		e.pos++
		return true
	}
	return false
}

// whole parses one expression (a tuple when it has commas) that must
// take every token.
func (e *exprParser) whole() (expr, error) {
	x, err := e.parseTuple()
	if err != nil {
		return nil, err
	}
	if !e.done() {
		return nil, e.errorf("unexpected %s", e.peek())
	}
	return x, nil
}

// parseTuple parses "a" or "a, b, ..." (a tuple).
func (e *exprParser) parseTuple() (expr, error) {
	x, err := e.parseExpr()
	if err != nil || e.peek().s != "," || e.peek().kind != 'o' {
		return x, err
	}
	t := &listExpr{items: []expr{x}, tuple: true}
	for e.accept('o', ",") {
		if p := e.peek(); e.done() || p.kind == 'o' && (p.s == ")" || p.s == "]" || p.s == "}") {
			break
		}
		y, err := e.parseExpr()
		if err != nil {
			return nil, err
		}
		t.items = append(t.items, y)
	}
	return t, nil
}

// parseExpr parses an expression with an optional inline if.
func (e *exprParser) parseExpr() (expr, error) {
	x, err := e.parseOr()
	if err != nil {
		return nil, err
	}
	for e.accept('n', "if") {
		c, err := e.parseOr()
		if err != nil {
			return nil, err
		}
		var y expr
		if e.accept('n', "else") {
			if y, err = e.parseExpr(); err != nil {
				return nil, err
			}
		}
		x = &condExpr{cond: c, a: x, b: y}
	}
	return x, nil
}

func (e *exprParser) parseOr() (expr, error) {
	return e.binary(e.parseAnd, "n", "or")
}

func (e *exprParser) parseAnd() (expr, error) {
	return e.binary(e.parseNot, "n", "and")
}

// binary parses left-associative operators ops (of token kind k) over sub.
func (e *exprParser) binary(sub func() (expr, error), k string, ops ...string) (expr, error) {
	x, err := sub()
	if err != nil {
		return nil, err
	}
	for {
		t := e.peek()
		found := false
		for _, op := range ops {
			if t.kind == k[0] && t.s == op {
				found = true
			}
		}
		if !found {
			return x, nil
		}
		e.pos++
		y, err := sub()
		if err != nil {
			return nil, err
		}
		x = &binExpr{op: t.s, a: x, b: y}
	}
}

func (e *exprParser) parseNot() (expr, error) {
	if e.accept('n', "not") {
		if e.depth++; e.depth > maxNesting {
			return nil, e.errorf("more than %d nested \"not\"s, brackets or signs", maxNesting)
		}
		defer func() { e.depth-- }()
		x, err := e.parseNot()
		if err != nil {
			return nil, err
		}
		return &unExpr{op: "not", x: x}, nil
	}
	return e.parseCompare()
}

func (e *exprParser) parseCompare() (expr, error) {
	x, err := e.parseMath1()
	if err != nil {
		return nil, err
	}
	for {
		t := e.peek()
		op := ""
		switch {
		case t.kind == 'o' && (t.s == "==" || t.s == "!=" || t.s == "<" || t.s == ">" || t.s == "<=" || t.s == ">="):
			op = t.s
			e.pos++
		case t.kind == 'n' && t.s == "in":
			op = "in"
			e.pos++
		case t.kind == 'n' && t.s == "not" && e.pos+1 < len(e.toks) && e.toks[e.pos+1].kind == 'n' && e.toks[e.pos+1].s == "in":
			op = "not in"
			e.pos += 2
		default:
			return x, nil
		}
		y, err := e.parseMath1()
		if err != nil {
			return nil, err
		}
		x = &binExpr{op: op, a: x, b: y}
	}
}

func (e *exprParser) parseMath1() (expr, error) { return e.binary(e.parseConcat, "o", "+", "-") }
func (e *exprParser) parseConcat() (expr, error) {
	return e.binary(e.parseMath2, "o", "~")
}
func (e *exprParser) parseMath2() (expr, error) {
	return e.binary(e.parsePow, "o", "*", "/", "//", "%")
}
func (e *exprParser) parsePow() (expr, error) { return e.binary(e.parseUnary, "o", "**") }

func (e *exprParser) parseUnary() (expr, error) { return e.unary(true) }

// unary parses a unary - or + (whose operand takes no filters: -x|abs is
// abs(-x), as in Jinja) or a primary, then postfixes, then with filters
// the filters and tests.
func (e *exprParser) unary(withFilters bool) (expr, error) {
	if e.depth++; e.depth > maxNesting {
		return nil, e.errorf("more than %d nested \"not\"s, brackets or signs", maxNesting)
	}
	defer func() { e.depth-- }()
	var x expr
	if t := e.peek(); t.kind == 'o' && (t.s == "-" || t.s == "+") {
		e.pos++
		y, err := e.unary(false)
		if err != nil {
			return nil, err
		}
		x = &unExpr{op: t.s, x: y}
	} else {
		y, err := e.parsePrimary()
		if err != nil {
			return nil, err
		}
		x = y
	}
	x, err := e.parsePostfix(x)
	if err != nil || !withFilters {
		return x, err
	}
	return e.parseFilters(x)
}

// parsePrimary parses a literal, a name, or a parenthesised, list or
// dict expression.
func (e *exprParser) parsePrimary() (expr, error) {
	t := e.next()
	switch t.kind {
	case 'n':
		switch t.s {
		case "true", "True":
			return &litExpr{true}, nil
		case "false", "False":
			return &litExpr{false}, nil
		case "none", "None":
			return &litExpr{nil}, nil
		}
		return &nameExpr{t.s}, nil
	case 's':
		s := t.s
		for e.peek().kind == 's' { // adjacent literals are one string
			s += e.next().s
		}
		return &litExpr{s}, nil
	case 'i':
		v, err := strconv.ParseInt(t.s, 10, 64)
		if err != nil {
			return nil, e.errorf("integer %s: %v", t.s, err)
		}
		return &litExpr{v}, nil
	case 'f':
		v, err := strconv.ParseFloat(t.s, 64)
		if err != nil {
			return nil, e.errorf("number %s: %v", t.s, err)
		}
		return &litExpr{v}, nil
	case 'o':
		switch t.s {
		case "(":
			if e.accept('o', ")") {
				return &listExpr{tuple: true}, nil
			}
			x, err := e.parseTuple()
			if err != nil {
				return nil, err
			}
			if !e.accept('o', ")") {
				return nil, e.errorf("expected ), got %s", e.peek())
			}
			return x, nil
		case "[":
			l := &listExpr{}
			for !e.accept('o', "]") {
				if len(l.items) > 0 && !e.accept('o', ",") {
					return nil, e.errorf("expected , or ] in a list, got %s", e.peek())
				}
				if e.accept('o', "]") {
					break
				}
				x, err := e.parseExpr()
				if err != nil {
					return nil, err
				}
				l.items = append(l.items, x)
			}
			return l, nil
		case "{":
			return e.parseDict()
		}
	}
	return nil, e.errorf("unexpected %s", t)
}

func (e *exprParser) parseDict() (expr, error) {
	d := &dictExpr{}
	for !e.accept('o', "}") {
		if len(d.keys) > 0 && !e.accept('o', ",") {
			return nil, e.errorf("expected , or } in a dict, got %s", e.peek())
		}
		if e.accept('o', "}") {
			break
		}
		k, err := e.parseExpr()
		if err != nil {
			return nil, err
		}
		if !e.accept('o', ":") {
			return nil, e.errorf("expected : in a dict, got %s", e.peek())
		}
		v, err := e.parseExpr()
		if err != nil {
			return nil, err
		}
		d.keys, d.vals = append(d.keys, k), append(d.vals, v)
	}
	return d, nil
}

// parsePostfix parses attribute access, subscripts and calls after x.
func (e *exprParser) parsePostfix(x expr) (expr, error) {
	for {
		switch {
		case e.accept('o', "."):
			t := e.next()
			switch t.kind {
			case 'n':
				x = &attrExpr{x: x, name: t.s}
			case 'i':
				v, _ := strconv.ParseInt(t.s, 10, 64)
				x = &indexExpr{x: x, i: &litExpr{v}}
			default:
				return nil, e.errorf("expected an attribute name after ., got %s", t)
			}
		case e.accept('o', "["):
			s, err := e.parseSubscript(x)
			if err != nil {
				return nil, err
			}
			x = s
		case e.peek().kind == 'o' && e.peek().s == "(":
			e.pos++
			args, kw, err := e.parseArgs()
			if err != nil {
				return nil, err
			}
			x = &callExpr{fn: x, args: args, kw: kw}
		default:
			return x, nil
		}
	}
}

// parseSubscript parses x[i] or a slice x[lo:hi:step] after the "[".
func (e *exprParser) parseSubscript(x expr) (expr, error) {
	var parts [3]expr
	n := 0
	colon := false
	for {
		if t := e.peek(); !(t.kind == 'o' && (t.s == ":" || t.s == "]")) {
			y, err := e.parseExpr()
			if err != nil {
				return nil, err
			}
			parts[n] = y
		}
		if e.accept('o', "]") {
			break
		}
		if !e.accept('o', ":") || n == 2 {
			return nil, e.errorf("expected : or ] in a subscript, got %s", e.peek())
		}
		colon = true
		n++
	}
	if !colon {
		if parts[0] == nil { // x[] is x[()], as Jinja2 parses it
			parts[0] = &listExpr{tuple: true}
		}
		return &indexExpr{x: x, i: parts[0]}, nil
	}
	return &sliceExpr{x: x, lo: parts[0], hi: parts[1], step: parts[2]}, nil
}

// parseArgs parses call arguments after the "(": positional, then name=value.
func (e *exprParser) parseArgs() ([]expr, []kwArg, error) {
	var args []expr
	var kw []kwArg
	for !e.accept('o', ")") {
		if len(args)+len(kw) > 0 && !e.accept('o', ",") {
			return nil, nil, e.errorf("expected , or ) in the arguments, got %s", e.peek())
		}
		if e.accept('o', ")") {
			break
		}
		if t := e.peek(); t.kind == 'n' && e.pos+1 < len(e.toks) && e.toks[e.pos+1].kind == 'o' && e.toks[e.pos+1].s == "=" {
			e.pos += 2
			x, err := e.parseExpr()
			if err != nil {
				return nil, nil, err
			}
			kw = append(kw, kwArg{name: t.s, x: x})
			continue
		}
		if len(kw) > 0 {
			return nil, nil, e.errorf("a positional argument after a keyword argument")
		}
		x, err := e.parseExpr()
		if err != nil {
			return nil, nil, err
		}
		args = append(args, x)
	}
	return args, kw, nil
}

// parseFilters parses "| filter(args)" and "is [not] test args" after x.
func (e *exprParser) parseFilters(x expr) (expr, error) {
	for {
		switch {
		case e.accept('o', "|"):
			t := e.next()
			if t.kind != 'n' {
				return nil, e.errorf("expected a filter name after |, got %s", t)
			}
			name := t.s
			for e.peek().s == "." && e.pos+1 < len(e.toks) { // dotted filter names
				e.pos++
				name += "." + e.next().s
			}
			f := &filterExpr{x: x, name: name}
			if _, ok := filters[name]; !ok {
				return nil, e.errorf("filter %q is not supported (Strata's chat templates have: %s)", name, strings.Join(filterNames(), ", "))
			}
			if e.accept('o', "(") {
				var err error
				if f.args, f.kw, err = e.parseArgs(); err != nil {
					return nil, err
				}
			}
			x = f
		case e.accept('n', "is"):
			t := &testExpr{x: x, not: e.accept('n', "not")}
			n := e.next()
			if n.kind != 'n' {
				return nil, e.errorf("expected a test name after is, got %s", n)
			}
			t.name = n.s
			if _, ok := tests[t.name]; !ok {
				return nil, e.errorf("test %q is not supported (Strata's chat templates have: %s)", t.name, strings.Join(testNames(), ", "))
			}
			switch p := e.peek(); {
			case p.kind == 'o' && p.s == "(":
				e.pos++
				args, _, err := e.parseArgs()
				if err != nil {
					return nil, err
				}
				t.args = args
			case p.kind == 's' || p.kind == 'i' || p.kind == 'f' || p.kind == 'n' && !isKeyword(p.s):
				a, err := e.parsePrimary()
				if err != nil {
					return nil, err
				}
				if a, err = e.parsePostfix(a); err != nil {
					return nil, err
				}
				t.args = []expr{a}
			}
			x = t
		default:
			return x, nil
		}
	}
}

// isKeyword says whether a name is an operator word, never a test's argument.
func isKeyword(s string) bool {
	switch s {
	case "and", "or", "not", "in", "is", "if", "else":
		return true
	}
	return false
}
