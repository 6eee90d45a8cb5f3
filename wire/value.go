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
	b, err := marshalJSON(x.v)
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

// prepare checks v, a value of Event.Data, for what both encodings can carry
// (finite numbers, raw JSON that decodes, at most maxDepth nesting) and
// returns it ready for the encoder of one of them, and whether that is a
// copy: json.Number and, in msgpack, json.RawMessage replaced by the values
// they hold; in JSON, raw JSON as it is and a float with an integral value
// written with a ".0", so that it decodes as a float again. Slices and maps
// are copied only when something in them changes. Values of other types are
// left to the encoders.
func prepare(v any, toJSON bool, depth int) (any, bool, error) {
	if depth > maxDepth {
		return nil, false, fmt.Errorf("arrays and maps nest deeper than %d levels", maxDepth)
	}
	switch x := v.(type) {
	case float64:
		return prepareFloat(v, x, 64, toJSON)
	case float32:
		return prepareFloat(v, float64(x), 32, toJSON)
	case json.Number:
		n, err := parseNumber(string(x))
		if err != nil {
			return nil, false, err
		}
		n, _, err = prepare(n, toJSON, depth)
		return n, true, err
	case json.RawMessage:
		if len(x) == 0 {
			return nil, true, nil
		}
		if !utf8.Valid(x) {
			return nil, false, errors.New("raw JSON data is not valid UTF-8")
		}
		n, err := decodeJSONValue(x)
		if err != nil || toJSON { // encoding/json compacts it
			return x, false, wrapError("raw JSON data: %w", err)
		}
		return n, true, nil
	case []any:
		var out []any
		for i, e := range x {
			n, changed, err := prepare(e, toJSON, depth+1)
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
		for _, k := range slices.Sorted(maps.Keys(x)) { // the same error first every time
			n, changed, err := prepare(x[k], toJSON, depth+1)
			if err != nil {
				return nil, false, err
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

// prepareFloat prepares v, which holds f, a float of that many bits.
func prepareFloat(v any, f float64, bits int, toJSON bool) (any, bool, error) {
	if !isFinite(f) {
		return nil, false, fmt.Errorf("%v is not a number JSON can carry", f)
	}
	if toJSON && f == math.Trunc(f) && math.Abs(f) < 1e21 { // encoding/json writes 1e21 and up with an exponent
		return wholeFloat{f, bits}, true, nil
	}
	return v, false, nil
}

// wholeFloat is a float with an integral value, which JSON writes as 1.0,
// not 1, so that it decodes as a float again.
type wholeFloat struct {
	f    float64
	bits int
}

func (w wholeFloat) MarshalJSON() ([]byte, error) {
	return append(strconv.AppendFloat(nil, w.f, 'f', -1, w.bits), ".0"...), nil
}

// wrapError wraps a non-nil err with fmt.Errorf(format, err).
func wrapError(format string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf(format, err)
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
