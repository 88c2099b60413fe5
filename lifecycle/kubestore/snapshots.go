package kubestore

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/airlockdev/airlock/lifecycle"
)

// Snapshot records (lifecycle.SnapshotStore): one Secret per snapshot in
// SecretNamespace, named SnapshotPrefix+"<snapshot id>", labelled LabelSnapshot, its
// document under SnapshotKey. A Secret, not a resource of its own: lifecycle's Role
// already reads and writes Secrets there, and a snapshot's record names the policy and
// vault of a sandbox. Reads go to the API server (never a cache), so every replica sees
// every other's snapshots at once.
const (
	LabelSnapshot  = "airlock.dev/snapshot"
	SnapshotPrefix = "airlock-snapshot-"
	SnapshotKey    = "snapshot"
)

var _ lifecycle.SnapshotStore = (*Store)(nil)

// PutSnapshot writes the document of snapshot id, replacing any previous one.
func (s *Store) PutSnapshot(id string, doc []byte) error {
	ctx, cancel := bg()
	defer cancel()
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: SnapshotPrefix + id, Labels: map[string]string{
			LabelSnapshot: "true", "app.kubernetes.io/managed-by": "airlock",
		}},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{SnapshotKey: doc},
	}
	secrets := s.cfg.Client.CoreV1().Secrets(s.cfg.SecretNamespace)
	_, err := secrets.Create(ctx, sec, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		_, err = secrets.Update(ctx, sec, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("kubestore: writing snapshot %s: %w", id, err)
	}
	return nil
}

// DeleteSnapshot removes the record of snapshot id; a missing one is not an error.
func (s *Store) DeleteSnapshot(id string) error {
	ctx, cancel := bg()
	defer cancel()
	err := s.cfg.Client.CoreV1().Secrets(s.cfg.SecretNamespace).Delete(ctx, SnapshotPrefix+id, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("kubestore: deleting snapshot %s: %w", id, err)
	}
	return nil
}

// Snapshots returns every snapshot document by id, read from the API server.
func (s *Store) Snapshots() (map[string][]byte, error) {
	ctx, cancel := bg()
	defer cancel()
	list, err := s.cfg.Client.CoreV1().Secrets(s.cfg.SecretNamespace).List(ctx, metav1.ListOptions{LabelSelector: LabelSnapshot})
	if err != nil {
		return nil, fmt.Errorf("kubestore: listing snapshots: %w", err)
	}
	out := make(map[string][]byte, len(list.Items))
	for _, sec := range list.Items {
		if id, ok := strings.CutPrefix(sec.Name, SnapshotPrefix); ok && id != "" && sec.Data[SnapshotKey] != nil {
			out[id] = sec.Data[SnapshotKey]
		}
	}
	return out, nil
}

// SharedSnapshots implements lifecycle.SharedSnapshotStore: several replicas write
// these records.
func (s *Store) SharedSnapshots() bool { return true }
