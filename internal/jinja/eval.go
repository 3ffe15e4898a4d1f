package jinja

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"
)

// The evaluator of the chat-template interpreter. Scopes follow Jinja's:
// a set inside an if is seen after it, a for loop's body gets a fresh
// scope on every iteration (what it sets is gone at the next), and a
// namespace() carries values out of loops.

// renderer renders one template.
type renderer struct {
	out    text // charged to bud
	bud    *budget
	scopes []map[string]any
	depth  int // expressions being evaluated, one in another: bounded (maxExprDepth)
}

// maxExprDepth bounds how deep expressions nest, a chain of operators,
// filters or attributes included (Jinja2's compiler gives up near 1000
// too): a deeper one is an error, not a stack overflow.
const maxExprDepth = 1000

// ErrRaised is the error of raise_exception: the template refuses what
// it was given (a system message its model has no place for, say).
var ErrRaised = errors.New("the template raised an exception")

// loop control, as errors unwinding to the loop.
var (
	errBreak    = errors.New("break outside a loop")
	errContinue = errors.New("continue outside a loop")
)

// loopInfo is the loop variable of a for loop.
type loopInfo struct {
	index0, length int
	items          []any
}

func (l *loopInfo) attr(name string) any {
	switch name {
	case "index":
		return int64(l.index0 + 1)
	case "index0":
		return int64(l.index0)
	case "revindex":
		return int64(l.length - l.index0)
	case "revindex0":
		return int64(l.length - l.index0 - 1)
	case "first":
		return l.index0 == 0
	case "last":
		return l.index0 == l.length-1
	case "length":
		return int64(l.length)
	case "previtem":
		if l.index0 > 0 {
			return l.items[l.index0-1]
		}
	case "nextitem":
		if l.index0+1 < l.length {
			return l.items[l.index0+1]
		}
	case "cycle":
		return &fn{name: "loop.cycle", call: func(_ *budget, args []any, _ *dict) (any, error) {
			if len(args) == 0 {
				return nil, fmt.Errorf("loop.cycle needs at least one item")
			}
			return args[l.index0%len(args)], nil
		}}
	default:
		return undef{fmt.Sprintf("loop has no attribute %s", brief(name))}
	}
	return undef{"loop." + name}
}

// render runs a parsed template with the given variables, within the
// default budget (budget.go); ctx stops it (nil: nothing does).
func render(ctx context.Context, body []tmplNode, vars map[string]any) (string, error) {
	return renderWithin(newBudget(ctx, Limits{}), body, vars)
}

// renderWithin is render within budget b.
func renderWithin(b *budget, body []tmplNode, vars map[string]any) (string, error) {
	r := &renderer{bud: b, out: text{bud: b}, scopes: []map[string]any{globalFuncs, vars, {}}}
	if err := r.exec(body); err != nil {
		return "", err
	}
	return r.out.String(), nil
}

// globalFuncs are the functions Hugging Face gives chat templates, but
// strftime_now, which only ChatTemplate.WithDate gives (strftimeNow): a
// template asking for today's date would make the training data depend on
// the day (Llama-3.2-style templates then use their own default date).
// Read only: a set writes to an inner scope.
var globalFuncs = globals()

func globals() map[string]any {
	return map[string]any{
		"raise_exception": &fn{name: "raise_exception", call: func(b *budget, args []any, _ *dict) (any, error) {
			msg := ""
			if len(args) > 0 {
				var err error
				if msg, err = str(b, args[0]); err != nil {
					return nil, err
				}
			}
			return nil, fmt.Errorf("%w: %s", ErrRaised, msg)
		}},
		"namespace": &fn{name: "namespace", call: func(b *budget, args []any, kw *dict) (any, error) {
			ns := &namespace{d: newDict()}
			for _, a := range append(args, kw) {
				if d, ok := a.(*dict); ok {
					if err := b.allocN(int64(len(d.keys)), dictEntryBytes); err != nil {
						return nil, err
					}
					for _, k := range d.keys {
						ns.d.set(k, d.m[k])
					}
				}
			}
			return ns, nil
		}},
		"range": &fn{name: "range", call: pyRange},
		"dict": &fn{name: "dict", call: func(b *budget, _ []any, kw *dict) (any, error) {
			if err := b.allocN(int64(len(kw.keys)), dictEntryBytes); err != nil {
				return nil, err
			}
			d := newDict()
			for _, k := range kw.keys {
				d.set(k, kw.m[k])
			}
			return d, nil
		}},
	}
}

// pyRange is range(), at most maxRange items, as in Jinja2's sandbox.
func pyRange(b *budget, args []any, _ *dict) (any, error) {
	var ns []int64
	for _, a := range args {
		n, ok := integer(a)
		if !ok {
			return nil, fmt.Errorf("range: '%s' object cannot be interpreted as an integer", typeName(a))
		}
		ns = append(ns, n)
	}
	start, stop, step := int64(0), int64(0), int64(1)
	switch len(ns) {
	case 1:
		stop = ns[0]
	case 2:
		start, stop = ns[0], ns[1]
	case 3:
		start, stop, step = ns[0], ns[1], ns[2]
	default:
		return nil, fmt.Errorf("range expects 1 to 3 arguments, got %d", len(ns))
	}
	if step == 0 {
		return nil, fmt.Errorf("range: step must not be zero")
	}
	var n uint64 // Python's len(range(start, stop, step)), in uint64: stop-start may not fit in int64
	switch {
	case step > 0 && stop > start:
		n = (uint64(stop)-uint64(start)-1)/uint64(step) + 1
	case step < 0 && start > stop:
		n = (uint64(start)-uint64(stop)-1)/(-uint64(step)) + 1
	}
	if n > maxRange {
		return nil, fmt.Errorf("range: more than %d items (the most Jinja2's sandbox gives)", maxRange)
	}
	if err := b.allocN(int64(n), itemBytes+8); err != nil { // an int in an interface
		return nil, err
	}
	out := make([]any, n)
	for k := range out {
		out[k] = start + int64(k)*step // within [start, stop): cannot wrap
	}
	return out, nil
}

func (r *renderer) lookup(name string) any {
	for i := len(r.scopes) - 1; i >= 0; i-- {
		if v, ok := r.scopes[i][name]; ok {
			return v
		}
	}
	return undef{fmt.Sprintf("%q is undefined", name)}
}

func (r *renderer) step() error { return r.bud.step(1) }

// exec runs statements.
func (r *renderer) exec(body []tmplNode) error {
	for _, n := range body {
		if err := r.step(); err != nil {
			return err
		}
		switch n := n.(type) {
		case textNode:
			if err := r.out.add(n.s); err != nil {
				return err
			}
		case outNode:
			v, err := r.eval(n.x)
			if err != nil {
				return fmt.Errorf("line %d: %w", n.line, err)
			}
			s, err := str(r.bud, v)
			if err == nil {
				err = r.out.add(s)
			}
			if err != nil {
				return fmt.Errorf("line %d: %w", n.line, err)
			}
		case *ifNode:
			if err := r.execIf(n); err != nil {
				return err
			}
		case *forNode:
			if err := r.execFor(n); err != nil {
				return err
			}
		case *setNode:
			if err := r.execSet(n); err != nil {
				return fmt.Errorf("line %d: %w", n.line, err)
			}
		case *macroNode:
			r.defineMacro(n)
		case breakNode:
			return errBreak
		case continueNode:
			return errContinue
		}
	}
	return nil
}

func (r *renderer) execIf(n *ifNode) error {
	for i, c := range n.conds {
		v, err := r.eval(c)
		if err != nil {
			return err
		}
		if truthy(v) {
			return r.exec(n.bodies[i])
		}
	}
	return r.exec(n.els)
}

func (r *renderer) execFor(n *forNode) error {
	seq, err := r.eval(n.iter)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.line, err)
	}
	xs, err := items(r.bud, seq)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.line, err)
	}
	if n.cnd != nil { // the loop filter: loop.length counts what passes
		if err := r.bud.items(len(xs)); err != nil {
			return fmt.Errorf("line %d: %w", n.line, err)
		}
		kept := make([]any, 0, len(xs))
		sc := map[string]any{}
		for _, x := range xs {
			if err := r.step(); err != nil {
				return err
			}
			clear(sc)
			if err := bindLoopVars(r.bud, sc, n.vars, x); err != nil {
				return fmt.Errorf("line %d: %w", n.line, err)
			}
			r.scopes = append(r.scopes, sc)
			v, err := r.eval(n.cnd)
			r.scopes = r.scopes[:len(r.scopes)-1]
			if err != nil {
				return fmt.Errorf("line %d: %w", n.line, err)
			}
			if truthy(v) {
				kept = append(kept, x)
			}
		}
		xs = kept
	}
	if len(xs) == 0 {
		return r.exec(n.els)
	}
	li := &loopInfo{length: len(xs), items: xs}
	sc := map[string]any{} // each iteration's scope, emptied for the next
	for i, x := range xs {
		if err := r.step(); err != nil {
			return err
		}
		li.index0 = i
		clear(sc)
		sc["loop"] = li
		if err := bindLoopVars(r.bud, sc, n.vars, x); err != nil {
			return fmt.Errorf("line %d: %w", n.line, err)
		}
		r.scopes = append(r.scopes, sc)
		err := r.exec(n.body)
		r.scopes = r.scopes[:len(r.scopes)-1]
		switch {
		case errors.Is(err, errBreak):
			return nil
		case errors.Is(err, errContinue):
		case err != nil:
			return err
		}
	}
	return nil
}

// bindLoopVars sets the loop's variables to item (unpacked over several).
func bindLoopVars(b *budget, sc map[string]any, vars []string, item any) error {
	if len(vars) == 1 {
		sc[vars[0]] = item
		return nil
	}
	xs, err := items(b, item)
	if errors.Is(err, ErrBudget) {
		return err
	}
	if err != nil || len(xs) != len(vars) {
		return fmt.Errorf("cannot unpack %s into %d loop variables", brief(item), len(vars))
	}
	for i, v := range vars {
		sc[v] = xs[i]
	}
	return nil
}

func (r *renderer) execSet(n *setNode) error {
	var v any
	if n.x == nil { // a block set, its body perhaps empty
		sub := &renderer{bud: r.bud, out: text{bud: r.bud}, scopes: r.scopes, depth: r.depth}
		if err := sub.exec(n.body); err != nil {
			return err
		}
		v = sub.out.String()
	} else {
		var err error
		if v, err = r.eval(n.x); err != nil {
			return err
		}
	}
	scope := r.scopes[len(r.scopes)-1]
	switch {
	case n.attr != "":
		ns, ok := r.lookup(n.name).(*namespace)
		if !ok {
			return fmt.Errorf("cannot assign attribute %q on %s: only a namespace() takes attributes", n.attr, n.name)
		}
		ns.d.set(n.attr, v)
	case n.names != nil:
		xs, err := items(r.bud, v)
		if errors.Is(err, ErrBudget) {
			return err
		}
		if err != nil || len(xs) != len(n.names) {
			return fmt.Errorf("cannot unpack %s into %d names", brief(v), len(n.names))
		}
		for i, name := range n.names {
			scope[name] = xs[i]
		}
	default:
		scope[n.name] = v
	}
	return nil
}

// eval evaluates an expression.
func (r *renderer) eval(x expr) (any, error) {
	if r.depth++; r.depth > maxExprDepth {
		return nil, fmt.Errorf("expressions nested more than %d deep", maxExprDepth)
	}
	defer func() { r.depth-- }()
	if err := r.step(); err != nil {
		return nil, err
	}
	switch x := x.(type) {
	case *litExpr:
		return x.v, nil
	case *nameExpr:
		return r.lookup(x.name), nil
	case *attrExpr:
		v, err := r.eval(x.x)
		if err != nil {
			return nil, err
		}
		return getAttr(r.bud, v, x.name)
	case *indexExpr:
		v, err := r.eval(x.x)
		if err != nil {
			return nil, err
		}
		i, err := r.eval(x.i)
		if err != nil {
			return nil, err
		}
		return getItem(r.bud, v, i)
	case *sliceExpr:
		return r.evalSlice(x)
	case *callExpr:
		return r.evalCall(x)
	case *filterExpr:
		return r.evalFilter(x)
	case *testExpr:
		return r.evalTest(x)
	case *binExpr:
		return r.evalBinary(x)
	case *unExpr:
		v, err := r.eval(x.x)
		if err != nil {
			return nil, err
		}
		return unary(x.op, v)
	case *condExpr:
		c, err := r.eval(x.cond)
		if err != nil {
			return nil, err
		}
		if truthy(c) {
			return r.eval(x.a)
		}
		if x.b == nil {
			return undef{"the else branch of an inline if"}, nil
		}
		return r.eval(x.b)
	case *listExpr:
		if err := r.bud.items(len(x.items)); err != nil {
			return nil, err
		}
		out := make([]any, len(x.items))
		for i, it := range x.items {
			v, err := r.eval(it)
			if err != nil {
				return nil, err
			}
			out[i] = v
		}
		if x.tuple {
			return tuple(out), nil
		}
		return out, nil
	case *dictExpr:
		if err := r.bud.allocN(int64(len(x.keys)), dictEntryBytes); err != nil {
			return nil, err
		}
		d := newDict()
		for i := range x.keys {
			k, err := r.eval(x.keys[i])
			if err != nil {
				return nil, err
			}
			ks, ok := k.(string)
			if !ok {
				return nil, fmt.Errorf("dict keys must be strings here, got %s", typeName(k))
			}
			if err := r.bud.scan(len(ks)); err != nil { // hashed
				return nil, err
			}
			v, err := r.eval(x.vals[i])
			if err != nil {
				return nil, err
			}
			d.set(ks, v)
		}
		return d, nil
	}
	panic(fmt.Sprintf("data: eval of %T", x))
}

// evalArgs evaluates call arguments: positional ones, and keyword ones
// as a dict in their order (never nil).
func (r *renderer) evalArgs(args []expr, kw []kwArg) ([]any, *dict, error) {
	if err := r.bud.items(len(args) + 3*len(kw)); err != nil {
		return nil, nil, err
	}
	out := make([]any, len(args))
	for i, a := range args {
		v, err := r.eval(a)
		if err != nil {
			return nil, nil, err
		}
		out[i] = v
	}
	kws := newDict()
	for _, k := range kw {
		v, err := r.eval(k.x)
		if err != nil {
			return nil, nil, err
		}
		kws.set(k.name, v)
	}
	return out, kws, nil
}

func (r *renderer) evalCall(x *callExpr) (any, error) {
	f, err := r.eval(x.fn)
	if err != nil {
		return nil, err
	}
	args, kw, err := r.evalArgs(x.args, x.kw)
	if err != nil {
		return nil, err
	}
	switch f := f.(type) {
	case *fn:
		return f.call(r.bud, args, kw)
	case undef:
		return nil, f.use()
	}
	return nil, fmt.Errorf("'%s' object is not callable", typeName(f))
}

func (r *renderer) evalSlice(x *sliceExpr) (any, error) {
	v, err := r.eval(x.x)
	if err != nil {
		return nil, err
	}
	var bounds [3]*int64
	for i, e := range []expr{x.lo, x.hi, x.step} {
		if e == nil {
			continue
		}
		b, err := r.eval(e)
		if err != nil {
			return nil, err
		}
		if b == nil {
			continue
		}
		n, ok := integer(b)
		if !ok {
			return nil, fmt.Errorf("slice indices must be integers or None, not %s", typeName(b))
		}
		bounds[i] = &n
	}
	switch s := v.(type) {
	case string:
		if err := r.bud.allocN(int64(len(s)), 4); err != nil { // the runes
			return nil, err
		}
		rs := []rune(s)
		idx, err := sliceIndices(r.bud, len(rs), bounds)
		if err != nil {
			return nil, err
		}
		if err := r.bud.allocN(int64(len(idx)), 4); err != nil { // at most 4 bytes a rune
			return nil, err
		}
		var b strings.Builder
		for _, i := range idx {
			b.WriteRune(rs[i])
		}
		return b.String(), nil
	case []any, tuple:
		xs, _ := items(r.bud, s)
		idx, err := sliceIndices(r.bud, len(xs), bounds)
		if err != nil {
			return nil, err
		}
		if err := r.bud.items(len(idx)); err != nil {
			return nil, err
		}
		out := make([]any, len(idx))
		for j, i := range idx {
			out[j] = xs[i]
		}
		if _, ok := s.(tuple); ok {
			return tuple(out), nil
		}
		return out, nil
	case undef:
		return nil, s.use()
	}
	return nil, fmt.Errorf("'%s' object is not subscriptable", typeName(v))
}

// sliceIndices is Python's slice(lo, hi, step).indices(n) as a list.
func sliceIndices(bud *budget, n int, b [3]*int64) ([]int, error) {
	step := int64(1)
	if b[2] != nil {
		step = *b[2]
	}
	if step == 0 {
		return nil, fmt.Errorf("slice step cannot be zero")
	}
	clamp := func(p *int64, def int64) int64 {
		if p == nil {
			return def
		}
		v := *p
		if v < 0 {
			v += int64(n)
		}
		lo, hi := int64(0), int64(n)
		if step < 0 {
			lo, hi = -1, int64(n)-1
		}
		return max(lo, min(v, hi))
	}
	var lo, hi int64
	if step > 0 {
		lo, hi = clamp(b[0], 0), clamp(b[1], int64(n))
	} else {
		lo, hi = clamp(b[0], int64(n)-1), clamp(b[1], -1)
	}
	step = max(-int64(n)-1, min(step, int64(n)+1)) // the same indices, and i += step cannot wrap
	count := int64(0)
	if step > 0 && hi > lo {
		count = (hi - lo + step - 1) / step
	} else if step < 0 && lo > hi {
		count = (lo - hi - step - 1) / -step
	}
	if err := bud.allocN(count, 8); err != nil {
		return nil, err
	}
	out := make([]int, 0, count)
	for i := lo; (step > 0 && i < hi) || (step < 0 && i > hi); i += step {
		out = append(out, int(i))
	}
	return out, nil
}

func (r *renderer) evalBinary(x *binExpr) (any, error) {
	a, err := r.eval(x.a)
	if err != nil {
		return nil, err
	}
	switch x.op { // short-circuit: Python returns the deciding operand
	case "and":
		if !truthy(a) {
			return a, nil
		}
		return r.eval(x.b)
	case "or":
		if truthy(a) {
			return a, nil
		}
		return r.eval(x.b)
	}
	b, err := r.eval(x.b)
	if err != nil {
		return nil, err
	}
	return binaryOp(r.bud, x.op, a, b)
}

// binaryOp applies a binary operator with Python's semantics.
func binaryOp(bud *budget, op string, a, b any) (any, error) {
	switch op {
	case "==", "!=":
		eq, err := equal(bud, a, b)
		return eq == (op == "=="), err
	case "<", ">", "<=", ">=":
		c, err := compare(bud, a, b)
		if err != nil {
			return nil, err
		}
		return map[string]bool{"<": c < 0, ">": c > 0, "<=": c <= 0, ">=": c >= 0}[op], nil
	case "in":
		return contains(bud, b, a)
	case "not in":
		in, err := contains(bud, b, a)
		return !in, err
	case "~":
		sa, err := str(bud, a)
		if err != nil {
			return nil, err
		}
		sb, err := str(bud, b)
		if err != nil {
			return nil, err
		}
		if err := bud.alloc(int64(len(sa)) + int64(len(sb))); err != nil {
			return nil, err
		}
		return sa + sb, nil
	}
	for _, v := range []any{a, b} {
		if u, ok := v.(undef); ok {
			return nil, u.use()
		}
	}
	if v, ok, err := arith(bud, op, a, b); ok || err != nil {
		return v, err
	}
	return nil, fmt.Errorf("unsupported operand types for %s: '%s' and '%s'", op, typeName(a), typeName(b))
}

// arith is + - * / // % ** on numbers, and + and * on strings and lists;
// ok false when the operands do not support op.
func arith(bud *budget, op string, a, b any) (any, bool, error) {
	if op == "+" {
		switch x := a.(type) {
		case string:
			if y, ok := b.(string); ok {
				if err := bud.alloc(int64(len(x)) + int64(len(y))); err != nil {
					return nil, true, err
				}
				return x + y, true, nil
			}
		case []any:
			if y, ok := b.([]any); ok {
				if err := bud.items(len(x) + len(y)); err != nil {
					return nil, true, err
				}
				return append(append(make([]any, 0, len(x)+len(y)), x...), y...), true, nil
			}
		}
	}
	if op == "*" {
		if n, ok := integer(b); ok {
			n = max(n, 0)
			switch x := a.(type) {
			case string:
				if err := bud.allocN(n, int64(len(x))); err != nil {
					return nil, true, fmt.Errorf("a string of %d bytes repeated %d times: %w", len(x), n, err)
				}
				return strings.Repeat(x, int(n)), true, nil
			case []any:
				if err := bud.allocN(n, int64(len(x))*itemBytes); err != nil {
					return nil, true, fmt.Errorf("a list of %d items repeated %d times: %w", len(x), n, err)
				}
				out := make([]any, 0, len(x)*int(n))
				for i := int64(0); len(x) > 0 && i < n; i++ {
					out = append(out, x...)
				}
				return out, true, nil
			}
		}
	}
	ia, aInt := integer(a)
	ib, bInt := integer(b)
	fa, aNum := number(a)
	fb, bNum := number(b)
	if !aNum || !bNum {
		return nil, false, nil
	}
	if aInt && bInt {
		switch op {
		case "+":
			r := ia + ib
			if (ia > 0 && ib > 0 && r < 0) || (ia < 0 && ib < 0 && r >= 0) {
				return nil, true, ErrIntOverflow
			}
			return r, true, nil
		case "-":
			r := ia - ib
			if (ia >= 0 && ib < 0 && r < 0) || (ia < 0 && ib > 0 && r >= 0) {
				return nil, true, ErrIntOverflow
			}
			return r, true, nil
		case "*":
			r, ok := mulInt(ia, ib)
			if !ok {
				return nil, true, ErrIntOverflow
			}
			return r, true, nil
		case "//", "%":
			if ib == 0 {
				return nil, true, fmt.Errorf("integer division or modulo by zero")
			}
			if ia == math.MinInt64 && ib == -1 {
				return nil, true, ErrIntOverflow
			}
			q, m := ia/ib, ia%ib
			if m != 0 && (m < 0) != (ib < 0) { // Python floors
				q--
				m += ib
			}
			if op == "//" {
				return q, true, nil
			}
			return m, true, nil
		case "**":
			if ib >= 0 { // by squaring
				p, ok := int64(1), true
				for x := ia; ok && ib > 0; ib >>= 1 {
					if ib&1 == 1 {
						p, ok = mulInt(p, x)
					}
					if ok && ib > 1 {
						x, ok = mulInt(x, x)
					}
				}
				if !ok {
					return nil, true, ErrIntOverflow
				}
				return p, true, nil
			}
		}
	}
	switch op {
	case "+":
		return fa + fb, true, nil
	case "-":
		return fa - fb, true, nil
	case "*":
		return fa * fb, true, nil
	case "/":
		if fb == 0 {
			return nil, true, fmt.Errorf("division by zero")
		}
		return fa / fb, true, nil
	case "//":
		if fb == 0 {
			return nil, true, fmt.Errorf("float floor division by zero")
		}
		return math.Floor(fa / fb), true, nil
	case "%":
		if fb == 0 {
			return nil, true, fmt.Errorf("float modulo")
		}
		m := math.Mod(fa, fb)
		if m != 0 && (m < 0) != (fb < 0) {
			m += fb
		}
		return m, true, nil
	case "**":
		return math.Pow(fa, fb), true, nil
	}
	return nil, false, nil
}

// ErrIntOverflow is the error of integer arithmetic past int64: Python's
// integers are unbounded, the template's are
// int64; a result past them is an error, not a wrapped number.
var ErrIntOverflow = errors.New("integer overflow: the template's integers are 64-bit")

// mulInt is a*b and whether it fits in int64.
func mulInt(a, b int64) (int64, bool) {
	r := a * b
	if a != 0 && (r/a != b || (a == -1 && b == math.MinInt64)) {
		return 0, false
	}
	return r, true
}

func unary(op string, v any) (any, error) {
	if op == "not" {
		return !truthy(v), nil
	}
	if u, ok := v.(undef); ok {
		return nil, u.use()
	}
	if i, ok := integer(v); ok {
		if op == "-" {
			if i == math.MinInt64 {
				return nil, ErrIntOverflow
			}
			return -i, nil
		}
		return i, nil
	}
	if f, ok := v.(float64); ok {
		if op == "-" {
			return -f, nil
		}
		return f, nil
	}
	return nil, fmt.Errorf("bad operand type for unary %s: '%s'", op, typeName(v))
}

// getAttr is Jinja's x.name: a method or attribute first, then an item.
func getAttr(b *budget, v any, name string) (any, error) {
	switch x := v.(type) {
	case undef:
		return nil, x.use()
	case *namespace:
		if a, ok := x.d.get(name); ok {
			return a, nil
		}
		return undef{fmt.Sprintf("the namespace has no attribute %s", brief(name))}, nil
	case *loopInfo:
		return x.attr(name), nil
	}
	if m := method(v, name); m != nil {
		return m, nil
	}
	if _, ok := v.(string); ok && unbuiltStrMethods[name] {
		return nil, fmt.Errorf("method str.%s is not supported (Strata's chat templates have str.%s)", name, strings.Join(builtStrMethods, ", str."))
	}
	if d, ok := v.(*dict); ok {
		if a, ok := d.get(name); ok {
			return a, nil
		}
	}
	return undef{fmt.Sprintf("%s object has no attribute %s", typeName(v), brief(name))}, nil
}

// getItem is Jinja's x[i]: an item first, then an attribute.
func getItem(b *budget, v, i any) (any, error) {
	switch x := v.(type) {
	case undef:
		return nil, x.use()
	case *dict:
		if k, ok := i.(string); ok {
			if err := b.scan(len(k)); err != nil { // hashed
				return nil, err
			}
			if a, ok := x.get(k); ok {
				return a, nil
			}
		}
	case []any, tuple, string:
		n, ok := integer(i)
		if !ok {
			break
		}
		if s, ok := x.(string); ok {
			if c, ok, err := runeAt(b, s, n); ok || err != nil {
				return c, err
			}
			return undef{fmt.Sprintf("%s object has no element %s", typeName(v), brief(i))}, nil
		}
		xs, _ := items(b, x)
		if n < 0 {
			n += int64(len(xs))
		}
		if n >= 0 && n < int64(len(xs)) {
			return xs[n], nil
		}
		return undef{fmt.Sprintf("%s object has no element %s", typeName(v), brief(i))}, nil
	}
	if name, ok := i.(string); ok {
		return getAttr(b, v, name)
	}
	return undef{fmt.Sprintf("%s object has no element %s", typeName(v), brief(i))}, nil
}

// runeAt is s[n] (a character, n < 0 from the end) and whether s has it,
// found by walking from that end.
func runeAt(b *budget, s string, n int64) (string, bool, error) {
	i := 0
	if n >= 0 {
		for ; n > 0 && i < len(s); n-- {
			_, size := utf8.DecodeRuneInString(s[i:])
			i += size
		}
	} else {
		i = len(s)
		for ; n < 0 && i > 0; n++ {
			_, size := utf8.DecodeLastRuneInString(s[:i])
			i -= size
		}
	}
	walked := i
	if n < 0 {
		walked = len(s) - i
	}
	if err := b.walk(walked); err != nil {
		return "", false, err
	}
	if n != 0 || i >= len(s) {
		return "", false, nil
	}
	c, _ := utf8.DecodeRuneInString(s[i:])
	return string(c), true, b.alloc(8 + itemBytes)
}
