package docs

import (
	"bytes"
	"fmt"
	"go/scanner"
	"go/token"
	"io/fs"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"unicode"
)

// examplePaths are paths the documents name as files the reader creates (an overlay of
// their own), not files of the repository.
var examplePaths = []string{
	"deploy/kubernetes/overlays/mine",
}

// forbidden are citations of places outside the repository: the design and references
// that lived beside the checkout before the repository carried its own (docs/). Written
// in pieces so that this file does not cite them itself.
var forbidden = []string{
	"DESIGN" + ".md",
	"../" + "shared",
	"shared/" + "reference",
	"reference/" + "opensandbox",
	"reference/" + "kube-testenv",
	"reference/" + "ocsf",
}

// skipDirs are never walked: version control, dependencies and build output.
var skipDirs = map[string]bool{".git": true, "node_modules": true, "bin": true}

// textExts are the files besides Markdown and Go that are searched for forbidden
// citations (scripts, manifests, the console's assets, the Makefile).
var textExts = map[string]bool{
	".sh": true, ".yaml": true, ".yml": true, ".json": true, ".js": true, ".mjs": true,
	".css": true, ".html": true, ".env": true, ".service": true, ".c": true, ".h": true,
	".txt": true, ".toml": true, ".mod": true, "": true,
}

// TestDocumentsCiteWhatExists is the documentation's link check: every Markdown link
// and backticked repository path resolves, every #anchor names a heading of its target,
// every docs/ path in a Go comment exists, nothing cites a place outside the repository,
// and every README links to docs/architecture.md.
func TestDocumentsCiteWhatExists(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root not found from %s: %v", root, err)
	}
	c := &checker{root: root, anchors: map[string]map[string]bool{}}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if skipDirs[d.Name()] && p != root {
				return filepath.SkipDir
			}
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		if rel == "docs/links_test.go" {
			return nil
		}
		ext := filepath.Ext(p)
		if ext != ".md" && ext != ".go" && !textExts[ext] {
			return nil
		}
		src, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if bytes.IndexByte(src[:min(len(src), 8000)], 0) >= 0 {
			return nil // binary
		}
		c.checkForbidden(rel, string(src))
		switch {
		case ext == ".md" && vendored(rel):
			// Upstream text, kept unchanged: only the forbidden citations above.
		case ext == ".md":
			c.checkMarkdown(rel, string(src))
		case ext == ".go":
			c.checkGo(rel, src)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if c.checked < 100 {
		t.Errorf("only %d citations checked: the walk missed the repository", c.checked)
	}
	sort.Strings(c.problems)
	for _, p := range c.problems {
		t.Error(p)
	}
	t.Logf("%d citations checked", c.checked)
}

// vendored reports whether rel is an upstream file kept unchanged under docs/spec.
func vendored(rel string) bool {
	return strings.HasPrefix(rel, "docs/spec/") && rel != "docs/spec/README.md"
}

type checker struct {
	root     string
	anchors  map[string]map[string]bool // by repository-relative Markdown path
	problems []string
	checked  int
}

func (c *checker) failf(file string, line int, format string, args ...any) {
	c.problems = append(c.problems, fmt.Sprintf("%s:%d: %s", file, line, fmt.Sprintf(format, args...)))
}

func (c *checker) checkForbidden(rel, src string) {
	for i, line := range strings.Split(src, "\n") {
		for _, f := range forbidden {
			if strings.Contains(line, f) {
				c.failf(rel, i+1, "cites %q, which is outside the repository: cite docs/architecture.md#<section> or docs/spec/<file>", f)
			}
		}
	}
}

var (
	// inlineLink matches [text](target) and ![alt](target), with an optional title.
	inlineLink = regexp.MustCompile(`!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	// linkText matches the text of an inline link up to its target's parenthesis.
	linkText = regexp.MustCompile(`\[[^\]]*\]\(`)
	// refLink matches a reference definition: [label]: target.
	refLink = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)`)
	// atxHeading matches "## Title ##".
	atxHeading = regexp.MustCompile(`^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$`)
	// htmlAnchor matches <a id="x"> and <a name="x">.
	htmlAnchor = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)
	// scheme matches a link with a URL scheme (https:, mailto:).
	scheme = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:`)
	// goSymbol matches a last path element that is a package's identifier
	// (docker.Config.DNSOnGateway): the path then names the package's folder.
	goSymbol = regexp.MustCompile(`^[a-z0-9_]+\.[A-Z]`)
	// urlText matches URLs, which Go comments may hold and which are not repo paths.
	urlText = regexp.MustCompile(`[A-Za-z][A-Za-z0-9+.-]*://\S+`)
	// commentPath matches a repository path in a Go comment.
	commentPath = regexp.MustCompile(`(?:\.\.?/)*[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)+/?(?:#[A-Za-z0-9_-]+)?`)
)

// checkMarkdown checks the links and backticked paths of one Markdown file.
func (c *checker) checkMarkdown(rel, src string) {
	dir := path.Dir(rel)
	fence := ""
	linksArchitecture := false
	for i, line := range strings.Split(src, "\n") {
		n := i + 1
		trimmed := strings.TrimLeft(line, " \t>")
		if f := fenceOf(trimmed); f != "" {
			switch {
			case fence == "":
				fence = f
			case strings.HasPrefix(f, fence) && strings.TrimSpace(strings.TrimLeft(trimmed, fence[:1])) == "":
				fence = ""
			}
			continue
		}
		if fence != "" {
			continue
		}
		// A code span that is a link's text is checked as the link.
		line = linkText.ReplaceAllStringFunc(line, func(l string) string { return strings.ReplaceAll(l, "`", "") })
		prose, spans := splitCode(line)
		for _, m := range inlineLink.FindAllStringSubmatch(prose, -1) {
			if c.checkLink(rel, n, dir, m[1]) == "docs/architecture.md" {
				linksArchitecture = true
			}
		}
		if m := refLink.FindStringSubmatch(prose); m != nil {
			if c.checkLink(rel, n, dir, m[1]) == "docs/architecture.md" {
				linksArchitecture = true
			}
		}
		for _, s := range spans {
			if p, anchor, ok := repoPath(c.root, dir, s); ok {
				c.checkTarget(rel, n, dir, p, anchor, "`"+s+"`")
			}
		}
	}
	if path.Base(rel) == "README.md" && !strings.Contains(rel, "/testdata/") && !linksArchitecture {
		c.failf(rel, 1, "a README links to the design: add a link to docs/architecture.md (its section on this component)")
	}
}

// fenceOf returns the fence (``` or ~~~, with its length) a line opens or closes.
func fenceOf(trimmed string) string {
	for _, ch := range []string{"`", "~"} {
		if strings.HasPrefix(trimmed, ch+ch+ch) {
			n := len(trimmed) - len(strings.TrimLeft(trimmed, ch))
			return strings.Repeat(ch, n)
		}
	}
	return ""
}

// splitCode returns a line with its code spans blanked out, and the spans' contents.
func splitCode(line string) (string, []string) {
	var prose strings.Builder
	var spans []string
	for i := 0; i < len(line); {
		if line[i] != '`' {
			prose.WriteByte(line[i])
			i++
			continue
		}
		n := 0
		for i+n < len(line) && line[i+n] == '`' {
			n++
		}
		ticks := line[i : i+n]
		end := -1
		for j := i + n; j < len(line); {
			k := strings.Index(line[j:], ticks)
			if k < 0 {
				break
			}
			k += j
			m := 0
			for k+m < len(line) && line[k+m] == '`' {
				m++
			}
			if m == n {
				end = k
				break
			}
			j = k + m
		}
		if end < 0 {
			prose.WriteString(line[i:])
			break
		}
		spans = append(spans, strings.TrimSpace(line[i+n:end]))
		prose.WriteString("CODE")
		i = end + n
	}
	return prose.String(), spans
}

// checkLink checks one Markdown link target and returns the repository path it names
// ("" for external links).
func (c *checker) checkLink(rel string, line int, dir, target string) string {
	if scheme.MatchString(target) {
		return ""
	}
	p, anchor, _ := strings.Cut(target, "#")
	if p == "" {
		c.checkTarget(rel, line, dir, path.Base(rel), anchor, "link "+target)
		return rel
	}
	if u, err := url.PathUnescape(p); err == nil {
		p = u
	}
	if strings.HasPrefix(p, "/") {
		p = strings.TrimPrefix(p, "/")
	} else {
		p = path.Join(dir, p)
	}
	return c.checkTarget(rel, line, "", p, anchor, "link "+target)
}

// checkTarget checks that p (relative to dir, or to the repository root when dir is ""
// or it does not resolve there) exists and, with an anchor, that the anchor names a
// heading of the Markdown file (or folder README) it resolves to. It returns the
// resolved repository path ("" when it does not resolve).
func (c *checker) checkTarget(rel string, line int, dir, p, anchor, what string) string {
	c.checked++
	cands := []string{path.Clean(p)}
	if dir != "" && path.Join(dir, p) != cands[0] {
		cands = []string{path.Join(dir, p), path.Clean(p)}
	}
	resolved := ""
	inside := []string{}
	for _, cand := range cands {
		if cand == ".." || strings.HasPrefix(cand, "../") {
			continue
		}
		inside = append(inside, cand)
		if _, err := os.Stat(filepath.Join(c.root, filepath.FromSlash(cand))); err == nil {
			resolved = cand
			break
		}
	}
	if resolved == "" {
		switch {
		case len(inside) == 0:
			c.failf(rel, line, "%s points outside the repository", what)
		case slices.ContainsFunc(inside, func(p string) bool { return under(p, examplePaths) }):
		default:
			c.failf(rel, line, "%s: %s does not exist", what, strings.Join(inside, " nor "))
		}
		return ""
	}
	if anchor == "" {
		return resolved
	}
	md := resolved
	if info, err := os.Stat(filepath.Join(c.root, filepath.FromSlash(md))); err == nil && info.IsDir() {
		md = path.Join(md, "README.md")
	}
	if path.Ext(md) != ".md" {
		return resolved
	}
	if !c.anchorsOf(md)[anchor] {
		c.failf(rel, line, "%s: %s has no heading with anchor #%s", what, md, anchor)
	}
	return resolved
}

// under reports whether p is one of list or below one of them.
func under(p string, list []string) bool {
	return slices.ContainsFunc(list, func(l string) bool { return p == l || strings.HasPrefix(p, l+"/") })
}

// repoPath decides whether a backticked span names a repository path, and returns it
// (relative to dir or to the root) with its anchor. A span qualifies when it has no
// spaces or shell and template characters, and either contains a '/' with a first
// element that is a folder (beside the file or at the root), or ends in
// a document or Go extension; or is a bare name ending in .md.
func repoPath(root, dir, s string) (p, anchor string, ok bool) {
	if s == "" || strings.ContainsAny(s, " \t:<>{}[]()*$=@,;|'\"\\?&!+%^") || strings.HasPrefix(s, "/") ||
		strings.HasPrefix(s, "~") || strings.HasPrefix(s, "-") {
		return "", "", false
	}
	p, anchor, _ = strings.Cut(s, "#")
	docExt := slices.Contains([]string{".md", ".go", ".yml", ".yaml"}, path.Ext(p))
	if !strings.Contains(strings.TrimSuffix(p, "/"), "/") {
		return p, anchor, path.Ext(p) == ".md"
	}
	elems := strings.Split(strings.TrimSuffix(p, "/"), "/")
	if last := elems[len(elems)-1]; goSymbol.MatchString(last) {
		elems[len(elems)-1], _, _ = strings.Cut(last, ".")
		p = strings.Join(elems, "/")
		docExt = false
	}
	base := dir
	first := 0
	for first < len(elems) && (elems[first] == ".." || elems[first] == ".") {
		base = path.Join(base, elems[first])
		first++
	}
	if first == len(elems) || skipDirs[elems[first]] {
		return "", "", false
	}
	// The first element must be a folder of the tree: a build output such as ./airlock
	// (the binary `go build ./cmd/airlock` writes) does not make `airlock/...` a path.
	exists := func(d string) bool {
		fi, err := os.Stat(filepath.Join(root, filepath.FromSlash(path.Join(d, elems[first]))))
		return err == nil && fi.IsDir()
	}
	if docExt || exists(base) || (first == 0 && exists(".")) {
		return p, anchor, true
	}
	return "", "", false
}

// anchorsOf returns the anchors of a Markdown file's headings, as GitHub makes them.
func (c *checker) anchorsOf(rel string) map[string]bool {
	if a, ok := c.anchors[rel]; ok {
		return a
	}
	a := map[string]bool{}
	c.anchors[rel] = a
	src, err := os.ReadFile(filepath.Join(c.root, filepath.FromSlash(rel)))
	if err != nil {
		return a
	}
	seen := map[string]int{}
	fence := ""
	for _, line := range strings.Split(string(src), "\n") {
		trimmed := strings.TrimLeft(line, " \t")
		if f := fenceOf(trimmed); f != "" {
			if fence == "" {
				fence = f
			} else if strings.HasPrefix(f, fence) {
				fence = ""
			}
			continue
		}
		if fence != "" {
			continue
		}
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			a[m[1]] = true
		}
		m := atxHeading.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		s := Slug(m[2])
		if k := seen[s]; k > 0 {
			a[fmt.Sprintf("%s-%d", s, k)] = true
		} else {
			a[s] = true
		}
		seen[s]++
	}
	return a
}

// Slug is GitHub's anchor for a heading: the text as rendered (links and code reduced to
// their text), lower-cased, every character that is not a letter, a mark, a digit, '_',
// '-' or a space dropped, and spaces turned into '-'.
func Slug(heading string) string {
	heading = inlineLink.ReplaceAllStringFunc(heading, func(l string) string {
		return l[strings.Index(l, "[")+1 : strings.Index(l, "]")]
	})
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case unicode.IsLetter(r) || unicode.IsMark(r) || unicode.IsDigit(r) || r == '_' || r == '-':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

// checkGo checks the repository paths that a Go file's comments cite under docs/, and
// the Markdown and spec files (with '/') they cite anywhere.
func (c *checker) checkGo(rel string, src []byte) {
	fset := token.NewFileSet()
	file := fset.AddFile(rel, -1, len(src))
	var s scanner.Scanner
	s.Init(file, src, nil, scanner.ScanComments)
	dir := path.Dir(rel)
	for {
		pos, tok, lit := s.Scan()
		if tok == token.EOF {
			break
		}
		if tok != token.COMMENT {
			continue
		}
		line := fset.Position(pos).Line
		for i, text := range strings.Split(lit, "\n") {
			text = urlText.ReplaceAllString(text, "")
			for _, loc := range commentPath.FindAllStringIndex(text, -1) {
				if loc[0] > 0 && strings.ContainsRune("/~$}>", rune(text[loc[0]-1])) {
					continue // part of an absolute path or a template
				}
				m := strings.TrimRight(text[loc[0]:loc[1]], ".")
				p, anchor, _ := strings.Cut(m, "#")
				ext := path.Ext(p)
				if !strings.HasPrefix(p, "docs/") && ext != ".md" && ext != ".yml" && ext != ".yaml" {
					continue
				}
				c.checkTarget(rel, line+i, dir, p, anchor, m)
			}
		}
	}
}

// TestSlug pins the anchor rules the check relies on.
func TestSlug(t *testing.T) {
	for in, want := range map[string]string{
		"Components and layout":                "components-and-layout",
		"Ingress: the gateway":                 "ingress-the-gateway",
		"`egressd` and the DNS filter":         "egressd-and-the-dns-filter",
		"One origin per sandbox port (§11)":    "one-origin-per-sandbox-port-11",
		"[Link](x.md) text":                    "link-text",
		"L7: SNI/Host check, explicit proxy":   "l7-snihost-check-explicit-proxy",
		"Credential Vault — secrets on a host": "credential-vault--secrets-on-a-host",
		"snake_case stays":                     "snake_case-stays",
	} {
		if got := Slug(in); got != want {
			t.Errorf("Slug(%q) = %q, want %q", in, got, want)
		}
	}
}
