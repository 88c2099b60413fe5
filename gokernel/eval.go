package gokernel

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/scanner"
	"go/token"
	"io"
	"reflect"
	"strconv"
	"strings"

	"github.com/traefik/yaegi/interp"
	"github.com/traefik/yaegi/stdlib"
)

// Interpreter runs Go source cell by cell with the yaegi interpreter, keeping
// declarations and variables between cells. Only the standard library is importable.
type Interpreter struct {
	in *interp.Interpreter
}

// NewInterpreter returns an interpreter whose fmt.Print* and os.Stdout/os.Stderr write to
// stdout and stderr.
func NewInterpreter(stdout, stderr io.Writer) (*Interpreter, error) {
	in := interp.New(interp.Options{Stdout: stdout, Stderr: stderr})
	if err := in.Use(stdlib.Symbols); err != nil {
		return nil, err
	}
	return &Interpreter{in: in}, nil
}

// Outcome is what a cell did: Display is the text/plain form of the last expression's
// value ("" for none); Err is set when the cell failed.
type Outcome struct {
	Display string
	Err     *CellError
}

// CellError is a failed cell in Jupyter's error terms.
type CellError struct {
	// Name is CompileError, panic or Interrupt.
	Name      string
	Value     string
	Traceback []string
}

// Run evaluates a cell. Consecutive top-level declarations are evaluated together (so
// functions in one cell may call each other); every other statement is evaluated on its
// own, in order. Cancelling ctx stops the running code at its next loop iteration or
// call and the cell fails with Interrupt; state set before that is kept.
func (i *Interpreter) Run(ctx context.Context, code string) (out Outcome) {
	defer func() {
		if r := recover(); r != nil {
			out = Outcome{Err: &CellError{Name: "InternalError", Value: fmt.Sprint(r),
				Traceback: []string{fmt.Sprintf("interpreter failure: %v", r)}}}
		}
	}()
	chunks := splitCell(code)
	for n, c := range chunks {
		v, err := i.in.EvalWithContext(ctx, c.src)
		if err != nil {
			return Outcome{Err: cellError(ctx, err, c.line)}
		}
		if n == len(chunks)-1 && c.expr && v.IsValid() {
			out.Display = display(v)
		}
	}
	return out
}

func cellError(ctx context.Context, err error, line int) *CellError {
	var p interp.Panic
	var pp *interp.Panic
	switch {
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		return &CellError{Name: "Interrupt", Value: "execution interrupted",
			Traceback: []string{fmt.Sprintf("Interrupt: execution interrupted (cell line %d)", line)}}
	case errors.As(err, &pp):
		p = *pp
	case errors.As(err, &p):
	default:
		return &CellError{Name: "CompileError", Value: err.Error(),
			Traceback: []string{fmt.Sprintf("CompileError: %v (statement at cell line %d)", err, line)}}
	}
	tb := []string{fmt.Sprintf("panic: %v (statement at cell line %d)", p.Value, line)}
	for _, l := range strings.Split(strings.TrimSpace(string(p.Stack)), "\n") {
		if l != "" {
			tb = append(tb, l)
		}
	}
	return &CellError{Name: "panic", Value: fmt.Sprint(p.Value), Traceback: tb}
}

// display is a value's text/plain form: strings quoted, everything else as %v.
func display(v reflect.Value) string {
	if !v.CanInterface() {
		return v.String()
	}
	x := v.Interface()
	if s, ok := x.(string); ok {
		return strconv.Quote(s)
	}
	return fmt.Sprintf("%v", x)
}

// chunk is a piece of a cell evaluated at once; line is its first line (1-based).
type chunk struct {
	src  string
	line int
	decl bool
	expr bool // a lone expression whose value is shown
}

// splitCell cuts code at every top-level statement end (a newline or semicolon outside
// brackets and for/if/switch headers, as Go's scanner inserts them), and joins runs of declarations. On a scan
// error the whole cell is one chunk, for the interpreter to report.
func splitCell(code string) []chunk {
	fset := token.NewFileSet()
	file := fset.AddFile("cell", -1, len(code))
	var s scanner.Scanner
	bad := false
	s.Init(file, []byte(code), func(token.Position, string) { bad = true }, 0)
	var out []chunk
	start, depth, first := 0, 0, token.ILLEGAL
	header := false // in a for/if/switch header, whose semicolons end no statement
	cut := func(end int) {
		if first != token.ILLEGAL {
			src := strings.TrimSpace(code[start:end])
			decl := first == token.FUNC || first == token.TYPE || first == token.VAR ||
				first == token.CONST || first == token.IMPORT
			c := chunk{src: src, line: fset.Position(file.Pos(start)).Line, decl: decl}
			if !decl {
				c.expr = shownExpr(src)
			}
			if n := len(out); decl && n > 0 && out[n-1].decl {
				out[n-1].src += "\n" + src
			} else {
				out = append(out, c)
			}
		}
		start, first = min(end+1, len(code)), token.ILLEGAL
	}
	for {
		pos, tok, lit := s.Scan()
		if tok == token.EOF {
			break
		}
		off := file.Offset(pos)
		switch tok {
		case token.FOR, token.IF, token.SWITCH:
			header = header || depth == 0
		case token.LBRACE:
			if depth == 0 {
				header = false
			}
			depth++
		case token.LPAREN, token.LBRACK:
			depth++
		case token.RPAREN, token.RBRACK, token.RBRACE:
			depth--
		case token.SEMICOLON:
			if depth == 0 && !header {
				if lit == "\n" && off >= len(code) {
					off = len(code)
				}
				cut(off)
				continue
			}
		}
		if first == token.ILLEGAL {
			first = tok
			start = off
		}
	}
	cut(len(code))
	if bad || depth != 0 {
		return []chunk{{src: code, line: 1}}
	}
	return out
}

// shownExpr reports whether src is an expression whose value a notebook shows: not a
// call to a printing function (fmt.Println's byte count is noise).
func shownExpr(src string) bool {
	e, err := parser.ParseExpr(src)
	if err != nil {
		return false
	}
	call, ok := e.(*ast.CallExpr)
	if !ok {
		return true
	}
	switch f := call.Fun.(type) {
	case *ast.Ident:
		return f.Name != "print" && f.Name != "println" && f.Name != "panic"
	case *ast.SelectorExpr:
		if pkg, ok := f.X.(*ast.Ident); ok {
			switch pkg.Name {
			case "fmt", "log", "os", "time":
				return strings.HasPrefix(f.Sel.Name, "Sprint") || (pkg.Name == "time" && f.Sel.Name != "Sleep")
			}
		}
	}
	return true
}
