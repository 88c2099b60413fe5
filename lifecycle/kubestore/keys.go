package kubestore

import (
	"context"
	"fmt"
	"maps"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/airlockdev/airlock/principal"
)

// KeysSecret is the Secret (in Config.SecretNamespace, beside the access tokens) that
// holds the API keys' documents (principal.Stored: each key's SHA-256, never the key),
// one data entry per principal id. Every replica reads it (lifecycle re-reads it every
// Config.KeyRefresh, 500 ms by default), so a key revoked through one replica stops
// working on all within about that time.
const KeysSecret = "airlock-lifecycle-keys"

// keysTimeout bounds one read of the keys (the refresh runs every 500 ms).
const keysTimeout = 5 * time.Second

// Keys returns every API key document by principal id (principal.Store): a GET of
// KeysSecret on the API server (none yet: no keys).
func (s *Store) Keys() (map[string][]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), keysTimeout)
	defer cancel()
	sec, err := s.cfg.Client.CoreV1().Secrets(s.cfg.SecretNamespace).Get(ctx, KeysSecret, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return map[string][]byte{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("kubestore: reading the API keys: %w", err)
	}
	return maps.Clone(sec.Data), nil
}

// PutKey writes the document of principal id into KeysSecret (principal.Store).
func (s *Store) PutKey(id string, doc []byte) error {
	return s.updateKeys(func(data map[string][]byte) { data[id] = doc })
}

// DeleteKey removes principal id's document from KeysSecret; a missing one is not an
// error (principal.Store).
func (s *Store) DeleteKey(id string) error {
	return s.updateKeys(func(data map[string][]byte) { delete(data, id) })
}

// updateKeys applies change to KeysSecret's data, creating the Secret when missing and
// retrying on conflicts with other replicas' writes.
func (s *Store) updateKeys(change func(map[string][]byte)) error {
	ctx, cancel := bg()
	defer cancel()
	secrets := s.cfg.Client.CoreV1().Secrets(s.cfg.SecretNamespace)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		sec, err := secrets.Get(ctx, KeysSecret, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			sec = &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Name: KeysSecret, Labels: map[string]string{"app.kubernetes.io/managed-by": "airlock"}},
				Type:       corev1.SecretTypeOpaque, Data: map[string][]byte{},
			}
			change(sec.Data)
			_, err = secrets.Create(ctx, sec, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				return apierrors.NewConflict(corev1.Resource("secrets"), KeysSecret, err)
			}
			return err
		}
		if err != nil {
			return err
		}
		if sec.Data == nil {
			sec.Data = map[string][]byte{}
		}
		change(sec.Data)
		_, err = secrets.Update(ctx, sec, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("kubestore: writing the API keys: %w", err)
	}
	return nil
}

var _ principal.Store = (*Store)(nil)
