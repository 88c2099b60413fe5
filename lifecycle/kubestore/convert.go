package kubestore

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/airlockdev/airlock/lifecycle/kubestore/v1alpha1"
)

// A lifecycle record (a JSON object) maps onto a Sandbox resource by JSON name: id is
// the resource name, accessToken goes to the sandbox's Secret, status is
// status.sandboxStatus, every other key is in the spec or the status by the
// v1alpha1 types' JSON names. A key found in neither is an error, so a record field
// that the CRD would prune is caught at the first write, not lost.
const (
	keyID          = "id"
	keyAccessToken = "accessToken"
	keyStatus      = "status"
	statusField    = "sandboxStatus"
)

var (
	specKeys   = jsonNames(reflect.TypeFor[v1alpha1.SandboxSpec]())
	statusKeys = jsonNames(reflect.TypeFor[v1alpha1.SandboxStatus]())
)

func jsonNames(t reflect.Type) map[string]bool {
	out := map[string]bool{}
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" {
			out[name] = true
		}
	}
	return out
}

// toObject splits a record document into a Sandbox resource in namespace and the
// access token (empty when the record has none).
func toObject(namespace, instance string, doc []byte) (*unstructured.Unstructured, string, error) {
	var rec map[string]any
	if err := json.Unmarshal(doc, &rec); err != nil {
		return nil, "", fmt.Errorf("kubestore: sandbox document: %w", err)
	}
	id, _ := rec[keyID].(string)
	if id == "" {
		return nil, "", fmt.Errorf("kubestore: sandbox document without an id")
	}
	token, _ := rec[keyAccessToken].(string)
	spec, status := map[string]any{}, map[string]any{}
	for k, v := range rec {
		switch {
		case k == keyID || k == keyAccessToken:
		case k == keyStatus:
			status[statusField] = v
		case specKeys[k]:
			spec[k] = v
		case statusKeys[k]:
			status[k] = v
		default:
			return nil, "", fmt.Errorf("kubestore: sandbox field %q has no place in %s: add it to lifecycle/kubestore/v1alpha1 and run make generate", k, v1alpha1.APIVersion)
		}
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.APIVersion,
		"kind":       v1alpha1.SandboxKind,
		"metadata": map[string]any{
			"name":      id,
			"namespace": namespace,
			"labels":    map[string]any{v1alpha1.LabelInstance: instance},
		},
		"spec":   spec,
		"status": status,
	}}
	return obj, token, nil
}

// toDoc is the record document of obj with the access token put back.
func toDoc(obj *unstructured.Unstructured, token string) ([]byte, error) {
	rec := map[string]any{keyID: obj.GetName()}
	if spec, ok := obj.Object["spec"].(map[string]any); ok {
		for k, v := range spec {
			rec[k] = v
		}
	}
	if status, ok := obj.Object["status"].(map[string]any); ok {
		for k, v := range status {
			if k == statusField {
				rec[keyStatus] = v
				continue
			}
			rec[k] = v
		}
	}
	if token != "" {
		rec[keyAccessToken] = token
	}
	return json.Marshal(rec)
}

func sum(s string) []byte {
	h := sha256.Sum256([]byte(s))
	return h[:]
}
