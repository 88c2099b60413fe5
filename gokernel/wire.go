package gokernel

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"
)

// protocolVersion is the Jupyter messaging protocol version the kernel speaks.
const protocolVersion = "5.3"

var delimiter = []byte("<IDS|MSG>")

// errSignature is a message whose HMAC does not match the connection key.
var errSignature = errors.New("gokernel: bad message signature")

// Connection is a Jupyter connection file
// (https://jupyter-client.readthedocs.io/en/stable/kernels.html#connection-files).
type Connection struct {
	Transport       string `json:"transport"`
	IP              string `json:"ip"`
	ShellPort       int    `json:"shell_port"`
	IOPubPort       int    `json:"iopub_port"`
	StdinPort       int    `json:"stdin_port"`
	ControlPort     int    `json:"control_port"`
	HBPort          int    `json:"hb_port"`
	Key             string `json:"key"`
	SignatureScheme string `json:"signature_scheme"`
}

// ReadConnection reads and checks a connection file: tcp transport and hmac-sha256 (or
// no key) are supported.
func ReadConnection(path string) (Connection, error) {
	var c Connection
	b, err := os.ReadFile(path)
	if err != nil {
		return c, err
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("gokernel: connection file %s: %w", path, err)
	}
	if c.Transport != "tcp" {
		return c, fmt.Errorf("gokernel: transport %q not supported (tcp only)", c.Transport)
	}
	if c.Key != "" && c.SignatureScheme != "hmac-sha256" {
		return c, fmt.Errorf("gokernel: signature scheme %q not supported (hmac-sha256 only)", c.SignatureScheme)
	}
	return c, nil
}

// header is a message header.
type header struct {
	MsgID    string `json:"msg_id"`
	Session  string `json:"session"`
	Username string `json:"username"`
	Date     string `json:"date"`
	MsgType  string `json:"msg_type"`
	Version  string `json:"version"`
}

// message is a received message: routing identities, the raw parent-to-be header and
// the content.
type message struct {
	ids       [][]byte
	header    header
	rawHeader []byte
	content   json.RawMessage
}

type signer struct{ key []byte }

func (s signer) sign(parts ...[]byte) []byte {
	if len(s.key) == 0 {
		return []byte{}
	}
	mac := hmac.New(sha256.New, s.key)
	for _, p := range parts {
		mac.Write(p)
	}
	return []byte(hex.EncodeToString(mac.Sum(nil)))
}

// decode splits identities from the frames and checks the signature.
func (s signer) decode(frames [][]byte) (message, error) {
	i := 0
	for i < len(frames) && string(frames[i]) != string(delimiter) {
		i++
	}
	if len(frames)-i < 6 {
		return message{}, fmt.Errorf("gokernel: short message (%d frames)", len(frames))
	}
	f := frames[i+1:]
	if len(s.key) > 0 && !hmac.Equal(f[0], s.sign(f[1], f[2], f[3], f[4])) {
		return message{}, errSignature
	}
	m := message{ids: frames[:i], rawHeader: f[1], content: f[4]}
	if err := json.Unmarshal(f[1], &m.header); err != nil {
		return message{}, fmt.Errorf("gokernel: header: %w", err)
	}
	return m, nil
}

// encode returns the frames of a message of msgType answering parent (ids first).
func (s signer) encode(ids [][]byte, parent *message, msgType string, content any) ([][]byte, error) {
	h := header{MsgID: newID(), Username: "kernel", MsgType: msgType, Version: protocolVersion,
		Date: time.Now().UTC().Format(time.RFC3339Nano)}
	ph := []byte("{}")
	if parent != nil {
		h.Session = parent.header.Session
		ph = parent.rawHeader
	}
	hb, err := json.Marshal(h)
	if err != nil {
		return nil, err
	}
	cb, err := json.Marshal(content)
	if err != nil {
		return nil, err
	}
	meta := []byte("{}")
	out := append([][]byte{}, ids...)
	return append(out, delimiter, s.sign(hb, ph, meta, cb), hb, ph, meta, cb), nil
}

func newID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
