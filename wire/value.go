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

// value holds Event.Data or Event.FinalData on the wire. It is empty (left
// out) only when it holds nil: false, 0, "" and [] are data. To encode, it
// holds what prepare made of the event's value; decoded, the values of
// Event.Data.
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
	x.v = v
	return err
}

func (x value) EncodeMsgpack(enc *msgpack.Encoder) error {
	if err := enc.Encode(x.v); err != nil {
		return fmt.Errorf("field %q: %w", x.field, err)
	}
	return nil
}

// DecodeMsgpack decodes a value that scan has checked: no extension types,
// no map keys but strings, no NaN.
func (x *value) DecodeMsgpack(dec *msgpack.Decoder) error {
	v, err := dec.DecodeInterfaceLoose()
	if err != nil {
		return err
	}
	x.v, err = normalize(v)
	return err
}

// prepare checks v, a value of Event.Data, for what JSON can carry (finite
// numbers, raw JSON that decodes, at most maxDepth nesting) and returns it
// ready for the msgpack library, and whether that is a copy: json.Number and
// json.RawMessage replaced by the values they hold. Slices and maps are
// copied only when something in them changes. Values of other types are left
// to the library.
func prepare(v any, depth int) (any, bool, error) {
	if depth > maxDepth {
		return nil, false, errTooDeep
	}
	switch x := v.(type) {
	case float64:
		return v, false, checkFinite(x)
	case float32:
		return v, false, checkFinite(float64(x))
	case json.Number:
		n, err := parseNumber(string(x))
		return n, true, err
	case json.RawMessage:
		n, err := decodeRawJSON(x)
		return n, true, err
	case []any:
		var out []any
		for i, e := range x {
			n, changed, err := prepare(e, depth+1)
			if err != nil {
				return nil, false, err
			}
			if changed && out == nil {
				out = slices.Clone(x)
			}
			if changed {
				out[i] = n
			}
		}
		if out != nil {
			return out, true, nil
		}
	case map[string]any:
		var out map[string]any
		for k, e := range x {
			n, changed, err := prepare(e, depth+1)
			if err != nil {
				return nil, false, firstError(x, depth, err)
			}
			if changed && out == nil {
				out = maps.Clone(x)
			}
			if changed {
				out[k] = n
			}
		}
		if out != nil {
			return out, true, nil
		}
	}
	return v, false, nil
}

// appendJSON appends the JSON of v, a value of Event.Data, to b, with the
// checks of prepare: maps with sorted keys, and floats with a fraction or an
// exponent, so that they decode as floats again (1.0, not 1), which
// encoding/json cannot do. Values of other types are left to encoding/json,
// and so are strings with characters to escape. The caller compacts raw JSON.
func appendJSON(b []byte, v any, depth int) ([]byte, error) {
	if depth > maxDepth {
		return nil, errTooDeep
	}
	var err error
	switch x := v.(type) {
	case nil:
		return append(b, "null"...), nil
	case bool:
		return strconv.AppendBool(b, x), nil
	case string:
		return appendJSONString(b, x), nil
	case int64:
		return strconv.AppendInt(b, x, 10), nil
	case uint64:
		return strconv.AppendUint(b, x, 10), nil
	case float64:
		return appendJSONFloat(b, x, 64)
	case float32:
		return appendJSONFloat(b, float64(x), 32)
	case json.Number, json.RawMessage:
		if v, _, err = prepare(x, depth); err != nil {
			return nil, err
		}
		if raw, ok := x.(json.RawMessage); ok && v != nil {
			return append(b, raw...), nil // checked
		}
		return appendJSON(b, v, depth)
	case []any:
		if x == nil {
			return append(b, "null"...), nil
		}
		b = append(b, '[')
		for i, e := range x {
			if i > 0 {
				b = append(b, ',')
			}
			if b, err = appendJSON(b, e, depth+1); err != nil {
				return nil, err
			}
		}
		return append(b, ']'), nil
	case map[string]any:
		if x == nil {
			return append(b, "null"...), nil
		}
		b = append(b, '{')
		for i, k := range slices.Sorted(maps.Keys(x)) {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, k)
			b = append(b, ':')
			if b, err = appendJSON(b, x[k], depth+1); err != nil {
				return nil, err
			}
		}
		return append(b, '}'), nil
	}
	j, err := marshalJSON(v)
	return append(b, j...), err
}

// appendJSONString appends s as encoding/json does without HTML escaping,
// which it leaves to encoding/json when s has characters to escape.
func appendJSONString(b []byte, s string) []byte {
	plain := utf8.ValidString(s)
	for i := 0; plain && i < len(s); i++ {
		c := s[i]
		plain = c >= 0x20 && c != '"' && c != '\\' && (c != 0xe2 || !strings.HasPrefix(s[i:], "\u2028") && !strings.HasPrefix(s[i:], "\u2029"))
	}
	if !plain {
		j, _ := marshalJSON(s)
		return append(b, j...)
	}
	return append(append(append(b, '"'), s...), '"')
}

// appendJSONFloat appends f, a float of that many bits, as encoding/json
// does, plus ".0" when it would read as an integer.
func appendJSONFloat(b []byte, f float64, bits int) ([]byte, error) {
	if err := checkFinite(f); err != nil {
		return nil, err
	}
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) { // with an exponent
		var v any = f
		if bits == 32 {
			v = float32(f)
		}
		j, err := json.Marshal(v)
		return append(b, j...), err
	}
	start := len(b)
	b = strconv.AppendFloat(b, f, 'f', -1, bits)
	if !bytes.ContainsRune(b[start:], '.') {
		b = append(b, ".0"...)
	}
	return b, nil
}

// decodeRawJSON decodes raw JSON data into the values of Event.Data; empty
// data is nil.
func decodeRawJSON(raw json.RawMessage) (any, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	if !utf8.Valid(raw) {
		return nil, errors.New("raw JSON data is not valid UTF-8")
	}
	v, err := decodeJSONValue(raw)
	if err != nil {
		return nil, fmt.Errorf("raw JSON data: %w", err)
	}
	return v, nil
}

// firstError returns the error of the first value of m, in the order of its
// keys, that prepare rejects, so that it is the same every time; err is one.
func firstError(m map[string]any, depth int, err error) error {
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if _, _, err := prepare(m[k], depth+1); err != nil {
			return err
		}
	}
	return err
}

var errTooDeep = fmt.Errorf("arrays and maps nest deeper than %d levels", maxDepth)

func checkFinite(f float64) error {
	if !isFinite(f) {
		return fmt.Errorf("%v is not a number JSON can carry", f)
	}
	return nil
}

// normalize turns, in place, the numbers a decoder gives into those of
// Event.Data: json.Number into what parseNumber makes of it, and a uint64
// that fits into an int64 into an int64.
func normalize(v any) (any, error) {
	var err error
	switch x := v.(type) {
	case json.Number:
		return parseNumber(string(x))
	case uint64:
		if x <= math.MaxInt64 {
			return int64(x), nil
		}
	case []any:
		for i, e := range x {
			if x[i], err = normalize(e); err != nil {
				return nil, err
			}
		}
	case map[string]any:
		for k, e := range x {
			switch e.(type) {
			case json.Number, uint64, []any, map[string]any:
				if x[k], err = normalize(e); err != nil {
					return nil, err
				}
			}
		}
	}
	return v, nil
}

// decodeJSONValue decodes one JSON value into the values of Event.Data.
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
	return normalize(v)
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

func isFinite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }
