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
const protocolVersion = "5.3"

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
	Header       Header
	ParentHeader Header
	Metadata     map[string]any
	Content      json.RawMessage
}

// signer signs and checks messages with the connection file's key (hmac-sha256).
type signer struct{ key []byte }

func (s signer) sign(parts ...[]byte) []byte {
	if len(s.key) == 0 {
		return nil
	}
	mac := hmac.New(sha256.New, s.key)
	for _, p := range parts {
		mac.Write(p)
	}
	sum := mac.Sum(nil)
	out := make([]byte, hex.EncodedLen(len(sum)))
	hex.Encode(out, sum)
	return out
}

// encode returns the wire frames of a message: <IDS|MSG>, signature, header, parent
// header, metadata, content.
func (s signer) encode(session, msgType string, content any) ([][]byte, Header, error) {
	h := Header{
		MsgID: newID(), Session: session, Username: "execd", MsgType: msgType,
		Date: time.Now().UTC().Format(time.RFC3339Nano), Version: protocolVersion,
	}
	hb, err := json.Marshal(h)
	if err != nil {
		return nil, h, err
	}
	cb, err := json.Marshal(content)
	if err != nil {
		return nil, h, err
	}
	parent, meta := []byte("{}"), []byte("{}")
	return [][]byte{delimiter, s.sign(hb, parent, meta, cb), hb, parent, meta, cb}, h, nil
}

// decode parses wire frames (identities first, as a SUB or DEALER socket hands them
// over) and checks the signature.
func (s signer) decode(frames [][]byte) (Message, error) {
	i := 0
	for i < len(frames) && string(frames[i]) != string(delimiter) {
		i++
	}
	if len(frames)-i < 6 {
		return Message{}, fmt.Errorf("jupyter: short message (%d frames)", len(frames))
	}
	f := frames[i+1:]
	if len(s.key) > 0 && !hmac.Equal(f[0], s.sign(f[1], f[2], f[3], f[4])) {
		return Message{}, ErrSignature
	}
	var m Message
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
