package dnsfilter

import "math"

// DefaultMaxLabelBits is GuardConfig.MaxLabelBits's default: 128-bit identifiers that
// real names carry (UUIDs, 32 hex digits, 32-character base36 ids) score at most about
// 150 and pass; 48 hex digits (24 bytes) score at least about 160 and do not.
const DefaultMaxLabelBits = 160

// labelScore estimates how much arbitrary data one DNS label carries, in bits: the
// information of its random-looking parts, n·H, where n is their length and H the
// Shannon entropy of their characters (case folded), in bits per character.
//
// The label is read as tokens separated by '-' and '_'. A token of letters only that
// reads like a word — at least one vowel (a, e, i, o, u, y) in four letters and no run
// of more than four consonants — does not count; every other token does: digits, a mix
// of letters and digits, consonant strings, any other byte. Encoded data (hex, base32,
// base64, base36) is such a mix, so all of it counts and its score grows with its
// length: per character about 3.8 bits for hex, 4.3–4.7 for base32 to base64 at the
// lengths of a label. Names made of words and short numbers score low.
//
// Why not entropy alone: the Shannon entropy of a label is bounded by the log of its
// alphabet, 4 bits for hex, so a per-character limit above 4 never refuses hex however
// long, and a limit below 4 refuses words. Multiplying by the length measures what a
// tunnel cares about — data per query — and the word test keeps long names of words
// ("my-service-name-for-the-production-environment") at zero.
//
// Calibration (2,000 random labels each): 32 hex digits score 97–126, a UUID 105–125,
// "pub-" and 32 hex digits (a Cloudflare R2 bucket) 93–127, 32 base36 characters (an AWS
// Lambda function URL) 116–150, 40 hex 126–158; 48 hex 163–190, 60 hex about 230, 40
// base32 151–190, 63 base32 263–309. Ordinary names: files 0, registry-1 0,
// d3c33hcgiwev3 (CloudFront) 38, prod-registry-k8s-io-us-east-1 8,
// vpce-0a1b2c3d4e5f67890-abcdefgh 68. Not caught: data written as pronounceable or
// dictionary words; the distinct-name caps bound what such a tunnel moves.
//
// labelScore does not allocate; a label of words costs one pass over its bytes.
func labelScore(label string) float64 {
	start := 0
	for i := 0; i <= len(label); i++ {
		if i == len(label) || label[i] == '-' || label[i] == '_' {
			if !wordLike(label[start:i]) {
				return randomBits(label)
			}
			start = i + 1
		}
	}
	return 0
}

// randomBits is n·H over the tokens of label that are not words (labelScore).
func randomBits(label string) float64 {
	var counts [256]uint16
	var seen [256]byte
	distinct, n := 0, 0
	start := 0
	for i := 0; i <= len(label); i++ {
		if i < len(label) && label[i] != '-' && label[i] != '_' {
			continue
		}
		tok := label[start:i]
		start = i + 1
		if wordLike(tok) {
			continue
		}
		for j := 0; j < len(tok); j++ {
			c := fold[tok[j]]
			if counts[c] == 0 {
				seen[distinct] = c
				distinct++
			}
			counts[c]++
		}
		n += len(tok)
	}
	if n <= 1 {
		return 0
	}
	// n·H = n·log2(n) − Σ c·log2(c)
	bits := xlog2x(n)
	for _, c := range seen[:distinct] {
		bits -= xlog2x(int(counts[c]))
	}
	return bits
}

// wordLike reports whether tok reads like a word: letters only (either case), at least
// one vowel (y included) in four letters, no more than four consonants in a row. The
// empty token is a word (it carries nothing).
func wordLike(tok string) bool {
	vowels, run := 0, 0
	for i := 0; i < len(tok); i++ {
		switch letterClass[tok[i]] {
		case vowel:
			vowels++
			run = 0
		case consonant:
			if run++; run > 4 {
				return false
			}
		default:
			return false
		}
	}
	return 4*vowels >= len(tok)
}

const (
	vowel     = 1
	consonant = 2
)

// letterClass classifies bytes for wordLike: vowel, consonant or 0 (not a letter); fold
// maps A–Z to a–z and every other byte to itself.
var letterClass, fold = func() (class, fold [256]byte) {
	for c := range 256 {
		fold[c] = byte(c)
	}
	for c := byte('a'); c <= 'z'; c++ {
		k := byte(consonant)
		if c == 'a' || c == 'e' || c == 'i' || c == 'o' || c == 'u' || c == 'y' {
			k = vowel
		}
		class[c], class[c-'a'+'A'] = k, k
		fold[c-'a'+'A'] = c
	}
	return class, fold
}()

// xlog2xTable holds x·log2(x) for the character counts of a label in presentation form
// (at most 63 bytes, each at most 4 characters as \DDD).
var xlog2xTable = func() (t [256]float64) {
	for x := 1; x < len(t); x++ {
		t[x] = float64(x) * math.Log2(float64(x))
	}
	return t
}()

func xlog2x(x int) float64 {
	if x < len(xlog2xTable) {
		return xlog2xTable[x]
	}
	return float64(x) * math.Log2(float64(x))
}
