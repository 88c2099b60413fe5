// Package jupyter starts Jupyter kernels from their kernelspecs and talks to them over
// the Jupyter messaging protocol (wire protocol 5.3, HMAC-SHA256 signed frames on ZeroMQ
// sockets: https://jupyter-client.readthedocs.io/en/stable/messaging.html). It uses a
// pure-Go ZMTP implementation, so binaries built with it stay static.
package jupyter

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// protocolVersion is the messaging protocol version execd speaks.
const ProtocolVersion = "5.3"

// delimiter separates routing identities from the message frames.
var delimiter = []byte("<IDS|MSG>")

// ErrSignature is a received message whose HMAC does not match the connection key.
var ErrSignature = errors.New("jupyter: bad message signature")

// Header is a message header (and parent header).
type Header struct {
	MsgID    string `json:"msg_id"`
	Session  string `json:"session"`
	Username string `json:"username"`
	Date     string `json:"date"`
	MsgType  string `json:"msg_type"`
	Version  string `json:"version"`
}

// Message is one Jupyter message. Content stays raw; callers decode it by MsgType.
type Message struct {
	// Identities are the routing frames before the delimiter (a kernel's ROUTER socket
	// answers to them); RawHeader is Header as received, the parent header of a reply.
	Identities   [][]byte
	Header       Header
	RawHeader    []byte
	ParentHeader Header
	Metadata     map[string]any
	Content      json.RawMessage
}

// Codec signs, encodes and decodes the wire frames of the Jupyter messaging protocol
// with a connection file's key (hmac-sha256; no key: unsigned). Both ends use it:
// execd's client of a kernel and Airlock's own Go kernel (package gokernel).
type Codec struct{ Key []byte }

// Sign returns the hex HMAC of parts (empty without a key).
func (c Codec) Sign(parts ...[]byte) []byte {
	if len(c.Key) == 0 {
		return []byte{}
	}
	mac := hmac.New(sha256.New, c.Key)
	for _, p := range parts {
		mac.Write(p)
	}
	sum := mac.Sum(nil)
	out := make([]byte, hex.EncodedLen(len(sum)))
	hex.Encode(out, sum)
	return out
}

// Encode returns the wire frames of a message from username in session: ids, <IDS|MSG>,
// signature, header, parent header (parent: a received RawHeader; nil: none),
// metadata, content.
func (c Codec) Encode(ids [][]byte, session, username, msgType string, parent []byte, content any) ([][]byte, Header, error) {
	h := Header{
		MsgID: newID(), Session: session, Username: username, MsgType: msgType,
		Date: time.Now().UTC().Format(time.RFC3339Nano), Version: ProtocolVersion,
	}
	hb, err := json.Marshal(h)
	if err != nil {
		return nil, h, err
	}
	cb, err := json.Marshal(content)
	if err != nil {
		return nil, h, err
	}
	if parent == nil {
		parent = []byte("{}")
	}
	meta := []byte("{}")
	out := append([][]byte{}, ids...)
	return append(out, delimiter, c.Sign(hb, parent, meta, cb), hb, parent, meta, cb), h, nil
}

// Decode parses wire frames (identities first, as a ROUTER, SUB or DEALER socket hands
// them over) and checks the signature (ErrSignature).
func (c Codec) Decode(frames [][]byte) (Message, error) {
	i := 0
	for i < len(frames) && string(frames[i]) != string(delimiter) {
		i++
	}
	if len(frames)-i < 6 {
		return Message{}, fmt.Errorf("jupyter: short message (%d frames)", len(frames))
	}
	f := frames[i+1:]
	if len(c.Key) > 0 && !hmac.Equal(f[0], c.Sign(f[1], f[2], f[3], f[4])) {
		return Message{}, ErrSignature
	}
	m := Message{Identities: frames[:i], RawHeader: f[1]}
	if err := json.Unmarshal(f[1], &m.Header); err != nil {
		return Message{}, fmt.Errorf("jupyter: header: %w", err)
	}
	if err := json.Unmarshal(f[2], &m.ParentHeader); err != nil {
		return Message{}, fmt.Errorf("jupyter: parent header: %w", err)
	}
	json.Unmarshal(f[3], &m.Metadata)
	m.Content = json.RawMessage(f[4])
	return m, nil
}

func newID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
