package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/vmihailenco/msgpack/v5"
)

// value holds Event.Data or Event.FinalData on the wire. It encodes itself so
// that both encodings carry the same generic values (see Event.Data), and it
// is empty (left out) only when it holds nil: false, 0, "" and [] are data.
type value struct {
	v     any
	field string // the field's name, for encoding errors
}

// IsZero reports whether x holds nil; encoding/json's omitzero and msgpack's
// omitempty both ask it.
func (x value) IsZero() bool { return x.v == nil }

func (x value) MarshalJSON() ([]byte, error) {
	b, err := appendJSON(nil, x.v, 0)
	if err != nil {
		return nil, fmt.Errorf("field %q: %w", x.field, err)
	}
	return b, nil
}

func (x *value) UnmarshalJSON(b []byte) error {
	v, err := decodeJSONValue(b)
	if err != nil {
		return err
	}
	x.v = v
	return nil
}

func (x value) EncodeMsgpack(enc *msgpack.Encoder) error {
	if err := encodeValue(enc, x.v, 0); err != nil {
		return fmt.Errorf("field %q: %w", x.field, err)
	}
	return nil
}

func (x *value) DecodeMsgpack(dec *msgpack.Decoder) error {
	v, err := decodeValue(dec, 0)
	if err != nil {
		return err
	}
	x.v = v
	return nil
}

// decodeJSONValue decodes one JSON value into generic values, with numbers
// as parseNumber gives them.
func decodeJSONValue(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		switch {
		case errors.Is(err, io.EOF):
			return nil, errors.New("empty JSON value")
		case errors.Is(err, io.ErrUnexpectedEOF):
			return nil, errors.New("unexpected end of JSON input")
		}
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("trailing data after a JSON value")
	}
	return normalizeNumbers(v)
}

// normalizeNumbers replaces the json.Numbers in v, in place.
func normalizeNumbers(v any) (any, error) {
	switch v := v.(type) {
	case json.Number:
		return parseNumber(string(v))
	case []any:
		for i, e := range v {
			n, err := normalizeNumbers(e)
			if err != nil {
				return nil, err
			}
			v[i] = n
		}
	case map[string]any:
		for k, e := range v {
			n, err := normalizeNumbers(e)
			if err != nil {
				return nil, err
			}
			v[k] = n
		}
	}
	return v, nil
}

// parseNumber turns a JSON number into the Go value a msgpack number of the
// same kind decodes to: an integer literal into int64, or uint64 when it is
// above math.MaxInt64; anything else (a fraction, an exponent, an integer
// beyond uint64) into float64.
func parseNumber(s string) (any, error) {
	if !strings.ContainsAny(s, ".eE") {
		if i, err := strconv.ParseInt(s, 10, 64); err == nil {
			return i, nil
		}
		if u, err := strconv.ParseUint(s, 10, 64); err == nil {
			return u, nil
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	switch {
	case math.IsInf(f, 0):
		return nil, fmt.Errorf("number %s is too large for a float64", quote(s))
	case err != nil && !errors.Is(err, strconv.ErrRange): // ErrRange here is an underflow to 0
		return nil, fmt.Errorf("number %s is invalid", quote(s))
	}
	return f, nil
}

// checkRawJSON checks that raw JSON data holds what decodeJSONValue accepts
// (one value, UTF-8, numbers in range), without building its values, so that
// an event is never sent that its receiver cannot decode.
func checkRawJSON(raw []byte) error {
	if !utf8.Valid(raw) {
		return errors.New("raw JSON data is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("raw JSON data: %w", err)
		}
		if n, ok := tok.(json.Number); ok {
			if _, err := parseNumber(string(n)); err != nil {
				return fmt.Errorf("raw JSON data: %w", err)
			}
		}
	}
}

func isFinite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }

// appendJSON appends the JSON of a value of Event.Data to b: maps with sorted
// keys, no HTML escaping, and floats with a fraction or an exponent, so that
// they decode as floats again (1.0, not 1). Values of other types are left to
// encoding/json.
func appendJSON(b []byte, v any, depth int) ([]byte, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("arrays and maps nest deeper than %d levels", maxDepth)
	}
	switch v := v.(type) {
	case nil:
		return append(b, "null"...), nil
	case bool:
		return strconv.AppendBool(b, v), nil
	case string:
		return appendJSONString(b, v), nil
	case int:
		return strconv.AppendInt(b, int64(v), 10), nil
	case int8:
		return strconv.AppendInt(b, int64(v), 10), nil
	case int16:
		return strconv.AppendInt(b, int64(v), 10), nil
	case int32:
		return strconv.AppendInt(b, int64(v), 10), nil
	case int64:
		return strconv.AppendInt(b, v, 10), nil
	case uint:
		return strconv.AppendUint(b, uint64(v), 10), nil
	case uint8:
		return strconv.AppendUint(b, uint64(v), 10), nil
	case uint16:
		return strconv.AppendUint(b, uint64(v), 10), nil
	case uint32:
		return strconv.AppendUint(b, uint64(v), 10), nil
	case uint64:
		return strconv.AppendUint(b, v, 10), nil
	case float32:
		return appendJSONFloat(b, float64(v), 32)
	case float64:
		return appendJSONFloat(b, v, 64)
	case []any:
		if v == nil {
			return append(b, "null"...), nil
		}
		b = append(b, '[')
		for i, e := range v {
			if i > 0 {
				b = append(b, ',')
			}
			var err error
			if b, err = appendJSON(b, e, depth+1); err != nil {
				return nil, err
			}
		}
		return append(b, ']'), nil
	case map[string]any:
		if v == nil {
			return append(b, "null"...), nil
		}
		b = append(b, '{')
		for i, k := range slices.Sorted(maps.Keys(v)) {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, k)
			b = append(b, ':')
			var err error
			if b, err = appendJSON(b, v[k], depth+1); err != nil {
				return nil, err
			}
		}
		return append(b, '}'), nil
	case json.Number:
		n, err := parseNumber(string(v))
		if err != nil {
			return nil, err
		}
		return appendJSON(b, n, depth)
	case json.RawMessage:
		if len(v) == 0 {
			return append(b, "null"...), nil
		}
		if err := checkRawJSON(v); err != nil {
			return nil, err
		}
		var buf bytes.Buffer
		if err := json.Compact(&buf, v); err != nil {
			return nil, fmt.Errorf("raw JSON data: %w", err)
		}
		return append(b, buf.Bytes()...), nil
	default:
		j, err := marshalJSON(v)
		if err != nil {
			return nil, err
		}
		return append(b, j...), nil
	}
}

// appendJSONFloat appends f the way encoding/json does, plus ".0" when the
// result would read as an integer.
func appendJSONFloat(b []byte, f float64, bits int) ([]byte, error) {
	if !isFinite(f) {
		return nil, fmt.Errorf("%v is not a number JSON can carry", f)
	}
	format := byte('f')
	if abs := math.Abs(f); abs != 0 {
		if bits == 64 && (abs < 1e-6 || abs >= 1e21) || bits == 32 && (float32(abs) < 1e-6 || float32(abs) >= 1e21) {
			format = 'e'
		}
	}
	start := len(b)
	b = strconv.AppendFloat(b, f, format, -1, bits)
	if format == 'e' {
		// Clean up e-09 to e-9, as encoding/json does.
		if n := len(b); n-start >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
		return b, nil
	}
	if !bytes.ContainsRune(b[start:], '.') {
		b = append(b, ".0"...)
	}
	return b, nil
}

// appendJSONString appends s as a JSON string, escaping what JSON requires
// (and U+2028, U+2029, as encoding/json does) but not HTML characters, and
// replacing invalid UTF-8 with U+FFFD.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 || r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			switch r {
			case utf8.RuneError:
				b = append(b, `\ufffd`...)
			default:
				b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xf])
			}
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
