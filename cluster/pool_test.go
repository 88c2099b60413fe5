package cluster

import (
	"reflect"
	"testing"

	"github.com/airlockdev/airlock/lifecycle"
)

func TestParsePool(t *testing.T) {
	got, err := ParsePool("name=py, image=airlock/sandbox:1,size=2,cpu=500m,memory=512Mi")
	if err != nil {
		t.Fatal(err)
	}
	want := lifecycle.PoolSpec{Name: "py", Image: "airlock/sandbox:1", Size: 2,
		ResourceLimits: map[string]string{"cpu": "500m", "memory": "512Mi"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("ParsePool: %+v, want %+v", got, want)
	}
	for _, bad := range []string{"", "image=x", "size=1", "image=x,size=one", "image=x,size=1,gpu=1", "image=x,size=1,cpu"} {
		if _, err := ParsePool(bad); err == nil {
			t.Errorf("ParsePool(%q): no error", bad)
		}
	}
}
