package ctrsnap

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"

	contentapi "github.com/containerd/containerd/api/services/content/v1"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
)

// ocispecDigest is an OCI content digest ("sha256:<hex>").
type ocispecDigest = digest.Digest

// maxBlob bounds a manifest, index or config read here.
const maxBlob = 8 << 20

func digestOf(s string) digest.Digest { return digest.Digest(s) }

func randomHex() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// readJSON reads blob dgst of the content store into v.
func (c *Client) readJSON(ctx context.Context, dgst string, v any) error {
	st, err := contentapi.NewContentClient(c.conn).Read(ctx, &contentapi.ReadContentRequest{Digest: dgst})
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	for {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("reading %s: %w", dgst, err)
		}
		if buf.Len()+len(m.Data) > maxBlob {
			return fmt.Errorf("blob %s is over %d bytes", dgst, maxBlob)
		}
		buf.Write(m.Data)
	}
	return json.Unmarshal(buf.Bytes(), v)
}

// uncompressed is the digest of layer dgst's uncompressed content, which the differ
// records in the label containerd.io/uncompressed.
func (c *Client) uncompressed(ctx context.Context, dgst string) (string, error) {
	info, err := contentapi.NewContentClient(c.conn).Info(ctx, &contentapi.InfoRequest{Digest: dgst})
	if err != nil {
		return "", fmt.Errorf("ctrsnap: the layer's content: %w", err)
	}
	d := info.Info.Labels["containerd.io/uncompressed"]
	if d == "" {
		return "", errors.New("ctrsnap: the differ did not record the layer's uncompressed digest")
	}
	return d, nil
}

// writeJSON writes v as a blob of mediaType with labels (the garbage collector's
// references) and returns its descriptor.
func (c *Client) writeJSON(ctx context.Context, mediaType string, v any, labels map[string]string) (ocispec.Descriptor, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	desc := ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(b), Size: int64(len(b))}
	cc := contentapi.NewContentClient(c.conn)
	st, err := cc.Write(ctx)
	if err != nil {
		return desc, fmt.Errorf("ctrsnap: writing %s: %w", mediaType, err)
	}
	ref := "airlock-snapshot-blob-" + randomHex()
	send := func(req *contentapi.WriteContentRequest) error {
		if err := st.Send(req); err != nil {
			return err
		}
		_, err := st.Recv()
		return err
	}
	err = send(&contentapi.WriteContentRequest{Action: contentapi.WriteAction_WRITE, Ref: ref, Total: desc.Size,
		Expected: desc.Digest.String(), Data: b})
	if err == nil {
		// The offset is where the data ends: a commit at offset 0 would truncate it.
		err = send(&contentapi.WriteContentRequest{Action: contentapi.WriteAction_COMMIT, Ref: ref, Total: desc.Size,
			Offset: desc.Size, Expected: desc.Digest.String(), Labels: labels})
	}
	_ = st.CloseSend()
	if err != nil && status.Code(err) != codes.AlreadyExists {
		return desc, fmt.Errorf("ctrsnap: writing %s: %w", mediaType, err)
	}
	if status.Code(err) == codes.AlreadyExists { // the same blob exists: give it the labels
		paths := make([]string, 0, len(labels))
		for k := range labels {
			paths = append(paths, "labels."+k)
		}
		slices.Sort(paths)
		if _, err := cc.Update(ctx, &contentapi.UpdateRequest{Info: &contentapi.Info{Digest: desc.Digest.String(), Labels: labels},
			UpdateMask: &fieldmaskpb.FieldMask{Paths: paths}}); err != nil {
			return desc, fmt.Errorf("ctrsnap: labelling %s: %w", mediaType, err)
		}
	}
	return desc, nil
}
