package ocsf

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// schemaDir is the vendored OCSF schema source (only the files the events need);
// OCSF_SCHEMA_DIR points the tests at another copy (the whole source: see
// testdata/schema/VENDORED.md).
func schemaDir() string {
	if d := os.Getenv("OCSF_SCHEMA_DIR"); d != "" {
		return d
	}
	return filepath.Join("testdata", "schema")
}

// schema is the OCSF schema source as the OCSF server compiles it, enough to validate
// events: classes and objects with their parents (extends), included profiles and
// the dictionary's types.
type schema struct {
	dir        string
	dict       map[string]map[string]any // attribute name -> dictionary entry
	types      map[string]map[string]any // type name (string_t, ip_t, ...) -> entry
	categories map[string]int
	classFiles map[string]string // class name -> file
	objFiles   map[string]string // object name -> file

	mu   sync.Mutex
	used map[string]bool // files read (what must be vendored)
}

// def is a resolved class or object.
type def struct {
	name        string
	uid         int // class_uid (classes)
	category    int
	attrs       map[string]map[string]any
	constraints map[string]any
}

func loadSchema(dir string) (*schema, error) {
	s := &schema{dir: dir, classFiles: map[string]string{}, objFiles: map[string]string{}, used: map[string]bool{}}
	var dict struct {
		Attributes map[string]map[string]any `json:"attributes"`
		Types      struct {
			Attributes map[string]map[string]any `json:"attributes"`
		} `json:"types"`
	}
	if err := s.read("dictionary.json", &dict); err != nil {
		return nil, err
	}
	s.dict, s.types = dict.Attributes, dict.Types.Attributes
	var cats struct {
		Attributes map[string]struct {
			UID int `json:"uid"`
		} `json:"attributes"`
	}
	if err := s.read("categories.json", &cats); err != nil {
		return nil, err
	}
	s.categories = map[string]int{"other": 0}
	for k, v := range cats.Attributes {
		s.categories[k] = v.UID
	}
	for sub, index := range map[string]map[string]string{"events": s.classFiles, "objects": s.objFiles} {
		err := filepath.WalkDir(filepath.Join(dir, sub), func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(p, ".json") {
				return err
			}
			var head struct {
				Name string `json:"name"`
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if err := json.Unmarshal(b, &head); err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
			rel, _ := filepath.Rel(dir, p)
			index[head.Name] = rel
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return s, nil
}

func (s *schema) read(rel string, v any) error {
	s.mu.Lock()
	s.used[rel] = true
	s.mu.Unlock()
	b, err := os.ReadFile(filepath.Join(s.dir, rel))
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

type schemaFile struct {
	Name        string                     `json:"name"`
	UID         *int                       `json:"uid"`
	Category    string                     `json:"category"`
	Extends     string                     `json:"extends"`
	Attributes  map[string]json.RawMessage `json:"attributes"`
	Constraints map[string]any             `json:"constraints"`
}

// resolve compiles the class or object name: its parent's attributes, then the
// profiles it includes (each attribute marked with its profile unless it says
// "profile": null), then its own; enums are merged.
func (s *schema) resolve(name string, class bool) (*def, error) {
	files := s.objFiles
	if class {
		files = s.classFiles
	}
	rel, ok := files[name]
	if !ok {
		return nil, fmt.Errorf("no %s %q in the schema", map[bool]string{true: "class", false: "object"}[class], name)
	}
	var f schemaFile
	if err := s.read(rel, &f); err != nil {
		return nil, err
	}
	d := &def{name: name, attrs: map[string]map[string]any{}}
	if f.Extends != "" {
		p, err := s.resolve(f.Extends, class)
		if err != nil {
			return nil, err
		}
		for k, v := range p.attrs {
			d.attrs[k] = clone(v)
		}
		d.category, d.constraints = p.category, p.constraints
	}
	if f.Category != "" {
		d.category = s.categories[f.Category]
	}
	if f.UID != nil {
		d.uid = d.category*1000 + *f.UID
	}
	if f.Constraints != nil {
		d.constraints = f.Constraints
	}
	if inc, ok := f.Attributes["$include"]; ok {
		var paths []string
		if err := json.Unmarshal(inc, &paths); err != nil {
			var one string
			if err := json.Unmarshal(inc, &one); err != nil {
				return nil, fmt.Errorf("%s: $include: %w", rel, err)
			}
			paths = []string{one}
		}
		for _, p := range paths {
			var prof schemaFile
			if err := s.read(p, &prof); err != nil {
				return nil, err
			}
			for k, raw := range prof.Attributes {
				var a map[string]any
				if err := json.Unmarshal(raw, &a); err != nil {
					return nil, fmt.Errorf("%s: %s: %w", p, k, err)
				}
				if _, set := a["profile"]; !set {
					a["profile"] = prof.Name
				}
				d.attrs[k] = merge(d.attrs[k], a)
			}
		}
	}
	for k, raw := range f.Attributes {
		if k == "$include" {
			continue
		}
		var a map[string]any
		if err := json.Unmarshal(raw, &a); err != nil {
			return nil, fmt.Errorf("%s: %s: %w", rel, k, err)
		}
		d.attrs[k] = merge(d.attrs[k], a)
	}
	return d, nil
}

func clone(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// merge overlays b's keys on a; enums are joined.
func merge(a, b map[string]any) map[string]any {
	out := clone(a)
	for k, v := range b {
		if k == "enum" {
			e := map[string]any{}
			if old, ok := out["enum"].(map[string]any); ok {
				for i, c := range old {
					e[i] = c
				}
			}
			for i, c := range v.(map[string]any) {
				e[i] = c
			}
			out[k] = e
			continue
		}
		out[k] = v
	}
	return out
}

// validateEvent checks one event against its class (by class_uid): every required
// attribute present, no attribute the class does not declare, types, enum ids and
// their captions, constraints, profiles declared in metadata.profiles, category_uid
// and type_uid = class_uid*100 + activity_id. It returns every problem found.
func (s *schema) validateEvent(ev map[string]any, classes map[int]string) []string {
	var errs []string
	uid, ok := intOf(ev["class_uid"])
	if !ok {
		return []string{"class_uid: missing or not an integer"}
	}
	name, ok := classes[int(uid)]
	if !ok {
		return []string{fmt.Sprintf("class_uid %d: not a class of this schema", uid)}
	}
	c, err := s.resolve(name, true)
	if err != nil {
		return []string{err.Error()}
	}
	if int(uid) != c.uid {
		errs = append(errs, fmt.Sprintf("class_uid %d, class %s is %d", uid, name, c.uid))
	}
	if cat, _ := intOf(ev["category_uid"]); int(cat) != c.category {
		errs = append(errs, fmt.Sprintf("category_uid %v, class %s is in %d", ev["category_uid"], name, c.category))
	}
	act, _ := intOf(ev["activity_id"])
	if tu, ok := intOf(ev["type_uid"]); !ok || tu != uid*100+act {
		errs = append(errs, fmt.Sprintf("type_uid %v, want class_uid*100+activity_id = %d", ev["type_uid"], uid*100+act))
	}
	var profiles []string
	if md, ok := ev["metadata"].(map[string]any); ok {
		if ps, ok := md["profiles"].([]any); ok {
			for _, p := range ps {
				if s, ok := p.(string); ok {
					profiles = append(profiles, s)
				}
			}
		}
	}
	s.checkObject("", c, ev, profiles, &errs)
	return errs
}

// checkObject checks the attributes of v (an event or an object) against d.
func (s *schema) checkObject(path string, d *def, v map[string]any, profiles []string, errs *[]string) {
	fail := func(format string, args ...any) { *errs = append(*errs, path+fmt.Sprintf(format, args...)) }
	for k, a := range d.attrs {
		if p, ok := a["profile"].(string); ok && !slices.Contains(profiles, p) {
			continue // required only where the profile applies
		}
		if a["requirement"] == "required" {
			if _, ok := v[k]; !ok {
				fail("%s: required attribute missing (%s)", k, d.name)
			}
		}
	}
	for _, kind := range []string{"at_least_one", "just_one"} {
		list, _ := d.constraints[kind].([]any)
		if len(list) == 0 {
			continue
		}
		n := 0
		for _, k := range list {
			if _, ok := v[k.(string)]; ok {
				n++
			}
		}
		if n == 0 || (kind == "just_one" && n != 1) {
			fail("constraint %s %v of %s: %d present", kind, list, d.name, n)
		}
	}
	keys := make([]string, 0, len(v))
	for k := range v {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		a, ok := d.attrs[k]
		if !ok {
			fail("%s: not an attribute of %s", k, d.name)
			continue
		}
		if p, ok := a["profile"].(string); ok && !slices.Contains(profiles, p) {
			fail("%s: attribute of profile %s, not in metadata.profiles %v", k, p, profiles)
		}
		dict, ok := s.dict[k]
		if !ok {
			fail("%s: not in the dictionary", k)
			continue
		}
		attr := merge(dict, a)
		typ, _ := attr["type"].(string)
		sub := path + k
		if isArray, _ := attr["is_array"].(bool); isArray {
			arr, ok := v[k].([]any)
			if !ok {
				fail("%s: want an array of %s, got %T", k, typ, v[k])
				continue
			}
			for i, e := range arr {
				s.checkValue(fmt.Sprintf("%s[%d]", sub, i), typ, attr, e, profiles, errs)
			}
			continue
		}
		s.checkValue(sub, typ, attr, v[k], profiles, errs)
		if k == "class_uid" || k == "category_uid" {
			continue // the schema lists base_event's 0 only; checked by validateEvent
		}
		if e, ok := attr["enum"].(map[string]any); ok && len(e) > 0 {
			key := fmt.Sprint(v[k])
			if f, ok := v[k].(float64); ok {
				key = strconv.FormatFloat(f, 'f', -1, 64)
			}
			c, ok := e[key].(map[string]any)
			if !ok {
				fail("%s: %v is not in its enum", k, v[k])
				continue
			}
			if sib, _ := attr["sibling"].(string); sib != "" && key != "99" {
				if got, ok := v[sib]; ok && got != c["caption"] {
					fail("%s: %q is not the caption of %s %s (%q)", sib, got, k, key, c["caption"])
				}
			}
		}
	}
}

// checkValue checks one value of type typ (a primitive *_t, "object", or an object
// name).
func (s *schema) checkValue(path, typ string, attr map[string]any, v any, profiles []string, errs *[]string) {
	fail := func(format string, args ...any) { *errs = append(*errs, path+": "+fmt.Sprintf(format, args...)) }
	if typ == "object" {
		if _, ok := v.(map[string]any); !ok {
			fail("want an object, got %T", v)
		}
		return
	}
	if !strings.HasSuffix(typ, "_t") {
		m, ok := v.(map[string]any)
		if !ok {
			fail("want object %s, got %T", typ, v)
			return
		}
		d, err := s.resolve(typ, false)
		if err != nil {
			fail("%v", err)
			return
		}
		s.checkObject(path+".", d, m, profiles, errs)
		return
	}
	t := s.types[typ]
	base := typ
	if b, ok := t["type"].(string); ok {
		base = b
	}
	switch base {
	case "string_t":
		str, ok := v.(string)
		if !ok {
			fail("want a string (%s), got %T", typ, v)
			return
		}
		if typ == "ip_t" && net.ParseIP(str) == nil {
			fail("%q is not an IP address", str)
		}
		if ml, ok := t["max_len"].(float64); ok && float64(len(str)) > ml {
			fail("longer than %v", ml)
		}
	case "integer_t", "long_t":
		f, ok := v.(float64)
		if !ok || f != math.Trunc(f) {
			fail("want an integer (%s), got %v", typ, v)
			return
		}
		if base == "integer_t" && (f > math.MaxInt32 || f < math.MinInt32) {
			fail("%v out of the 32-bit integer range", f)
		}
		if r, ok := t["range"].([]any); ok && len(r) == 2 && (f < r[0].(float64) || f > r[1].(float64)) {
			fail("%v out of range %v", f, r)
		}
	case "float_t":
		if _, ok := v.(float64); !ok {
			fail("want a number, got %T", v)
		}
	case "boolean_t":
		if _, ok := v.(bool); !ok {
			fail("want a boolean, got %T", v)
		}
	case "json_t":
	default:
		fail("unknown type %s", typ)
	}
}

func intOf(v any) (int64, bool) {
	f, ok := v.(float64)
	if !ok || f != math.Trunc(f) {
		return 0, false
	}
	return int64(f), true
}

// classNamesByUID maps the class uids this package writes to the schema's class names.
var classNamesByUID = map[int]string{
	ClassBase: "base_event", ClassEventLog: "event_log_actvity", ClassNetworkActivity: "network_activity",
	ClassHTTPActivity: "http_activity", ClassDNSActivity: "dns_activity", ClassDeviceConfigState: "device_config_state_change",
	ClassAPIActivity: "api_activity", ClassFileActivity: "file_activity", ClassProcessActivity: "process_activity",
	ClassAuthentication: "authentication",
}

// TestSchemaVersion: metadata.version is the vendored schema's version.
func TestSchemaVersion(t *testing.T) {
	var v struct {
		Version string `json:"version"`
	}
	b, err := os.ReadFile(filepath.Join(schemaDir(), "version.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	if v.Version != SchemaVersion {
		t.Errorf("SchemaVersion %q, vendored schema %q", SchemaVersion, v.Version)
	}
}
