package gokernel

import (
	"strings"
	"testing"
)

func TestSplitCell(t *testing.T) {
	cases := []struct {
		name string
		code string
		want []string // chunks, decl chunks prefixed "D:", shown expressions "E:"
	}{
		{"decls_join", "import \"fmt\"\nfunc a() int { return b() }\nfunc b() int { return 1 }", []string{"D:import \"fmt\"\nfunc a() int { return b() }\nfunc b() int { return 1 }"}},
		{"statements", "x := 1; x++\nx", []string{"x := 1", "x++", "E:x"}},
		{"for_header", "for i := 0; i < 3; i++ {\n\tprintln(i)\n}", []string{"for i := 0; i < 3; i++ {\n\tprintln(i)\n}"}},
		{"if_init", "if v := 2; v > 1 { x = v }\nx", []string{"if v := 2; v > 1 { x = v }", "E:x"}},
		{"multiline_call", "f(1,\n  2)", []string{"E:f(1,\n  2)"}},
		{"println_hidden", "fmt.Println(1)", []string{"fmt.Println(1)"}},
		{"comments_only", "// nothing\n", nil},
		{"unbalanced", "func f() {", []string{"func f() {"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, c := range splitCell(tc.code) {
				s := c.src
				if c.decl {
					s = "D:" + s
				} else if c.expr {
					s = "E:" + s
				}
				got = append(got, s)
			}
			if strings.Join(got, "|") != strings.Join(tc.want, "|") {
				t.Errorf("splitCell(%q)\n got %q\nwant %q", tc.code, got, tc.want)
			}
		})
	}
}
