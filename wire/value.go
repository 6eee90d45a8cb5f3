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
// holds the event's value, which valueWriter checks as it writes it; decoded,
// the values of Event.Data.
type value struct {
	v     any
	field string // the field's name, for encoding errors
}

// IsZero reports whether x holds nil; encoding/json's omitzero and msgpack's
// omitempty both ask it.
func (x value) IsZero() bool { return x.v == nil }

func (x value) MarshalJSON() ([]byte, error) {
	var w valueWriter
	if err := w.value(x.v, 0); err != nil {
		return nil, fmt.Errorf("field %q: %w", x.field, err)
	}
	return w.b, nil
}

func (x *value) UnmarshalJSON(b []byte) error {
	v, err := decodeJSONValue(b)
	x.v = v
	return err
}

func (x value) EncodeMsgpack(enc *msgpack.Encoder) error {
	if err := (&valueWriter{enc: enc}).value(x.v, 0); err != nil {
		return fmt.Errorf("field %q: %w", x.field, err)
	}
	return nil
}

// DecodeMsgpack decodes a value that scan has checked: no extension types,
// no map keys but strings.
func (x *value) DecodeMsgpack(dec *msgpack.Decoder) error {
	v, err := dec.DecodeInterfaceLoose()
	if err != nil {
		return err
	}
	x.v, err = normalize(v)
	return err
}

// ValueJSON returns v, a value of [Event.Data], in JSON as an event carries
// it: NaN and infinities null, floats with a fraction or an exponent, map keys
// sorted, no HTML escaping.
func ValueJSON(v any) ([]byte, error) {
	var w valueWriter
	if err := w.value(v, 0); err != nil {
		return nil, err
	}
	return w.b, nil
}

// valueWriter writes a value of Event.Data in msgpack, to enc, or, when enc
// is nil, in JSON, appended to b. It is ours because neither library writes
// what JSON cannot carry the way the contract says (NaN and infinities as
// null in JSON, as floats in msgpack) nor checks raw JSON, and encoding/json
// writes the float 1.0 as 1, which decodes as an integer (a wrapper around
// each float made encoding 1.46 times slower). One walk serves both
// encodings; Go values it does not know go to the library.
type valueWriter struct {
	enc *msgpack.Encoder
	b   []byte
}

// value writes v with the keys of its maps sorted, checking raw JSON and
// nesting (at most maxDepth); a NaN or an infinity is null in JSON.
// json.Number and json.RawMessage become the values they hold; in JSON raw
// JSON is copied as it is (encoding/json compacts it).
func (w *valueWriter) value(v any, depth int) error {
	if depth > maxDepth {
		return errTooDeep
	}
	switch x := v.(type) {
	case float64:
		if w.enc == nil && !finite(x) {
			return w.scalar(nil)
		}
	case float32:
		if w.enc == nil && !finite(float64(x)) {
			return w.scalar(nil)
		}
	case json.Number:
		n, err := parseNumber(string(x))
		if err != nil {
			return err
		}
		return w.value(n, depth)
	case json.RawMessage:
		n, err := decodeRawJSON(x)
		switch {
		case err != nil:
			return err
		case n != nil && w.enc == nil:
			w.b = append(w.b, x...)
			return nil
		}
		return w.value(n, 0) // nested no deeper than the JSON decoder allows
	case []any:
		if x != nil {
			return w.array(x, depth)
		}
	case map[string]any:
		if x != nil {
			return w.object(x, depth)
		}
	}
	return w.scalar(v)
}

func (w *valueWriter) array(x []any, depth int) error {
	if err := w.delim('[', len(x)); err != nil {
		return err
	}
	for i, e := range x {
		if i > 0 {
			w.delim(',', 0)
		}
		if err := w.value(e, depth+1); err != nil {
			return err
		}
	}
	return w.delim(']', 0)
}

func (w *valueWriter) object(x map[string]any, depth int) error {
	if err := w.delim('{', len(x)); err != nil {
		return err
	}
	keys := slices.AppendSeq(make([]string, 0, len(x)), maps.Keys(x))
	slices.Sort(keys)
	for i, k := range keys {
		if i > 0 {
			w.delim(',', 0)
		}
		if w.enc == nil {
			w.b = append(appendJSONString(w.b, k), ':')
		} else if err := w.enc.EncodeString(k); err != nil {
			return err
		}
		if err := w.value(x[k], depth+1); err != nil {
			return err
		}
	}
	return w.delim('}', 0)
}

// delim writes the start of an array ('[') or a map ('{') of n elements, the
// comma between two elements, or the end (']', '}'); msgpack has only starts.
func (w *valueWriter) delim(c byte, n int) error {
	switch {
	case w.enc == nil:
		w.b = append(w.b, c)
	case c == '[':
		return w.enc.EncodeArrayLen(n)
	case c == '{':
		return w.enc.EncodeMapLen(n)
	}
	return nil
}

// scalar writes v, which value has checked: in msgpack as the library does,
// in JSON as encoding/json does without HTML escaping, but for a float that
// would read as an integer, which gets a ".0".
func (w *valueWriter) scalar(v any) error {
	if w.enc != nil {
		return w.enc.Encode(v)
	}
	switch x := v.(type) {
	case nil:
		w.b = append(w.b, "null"...)
	case bool:
		w.b = strconv.AppendBool(w.b, x)
	case string:
		w.b = appendJSONString(w.b, x)
	case int64:
		w.b = strconv.AppendInt(w.b, x, 10)
	case uint64:
		w.b = strconv.AppendUint(w.b, x, 10)
	case float64:
		w.b = appendJSONFloat(w.b, x, 64)
	case float32:
		w.b = appendJSONFloat(w.b, float64(x), 32)
	default:
		j, err := marshalJSON(v)
		w.b = append(w.b, j...)
		return err
	}
	return nil
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

// appendJSONFloat appends f, a finite float of that many bits, as
// encoding/json does, plus ".0" when it would read as an integer.
func appendJSONFloat(b []byte, f float64, bits int) []byte {
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) { // with an exponent
		var v any = f
		if bits == 32 {
			v = float32(f)
		}
		j, _ := json.Marshal(v)
		return append(b, j...)
	}
	start := len(b)
	b = strconv.AppendFloat(b, f, 'f', -1, bits)
	if !bytes.ContainsRune(b[start:], '.') {
		b = append(b, ".0"...)
	}
	return b
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

var errTooDeep = fmt.Errorf("arrays and maps nest deeper than %d levels", maxDepth)

func checkFinite(f float64) error {
	if !finite(f) {
		return fmt.Errorf("%v is not a number JSON can carry", f)
	}
	return nil
}

func finite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }

// Nonfinite is the place of a NaN or an infinity in a value whose JSON form
// has null there: the harness sends a value's JSON form, and these beside it
// (a harness event's "nonfinite": [[path, "nan"], ...]), so that the value
// keeps its floats in msgpack. Path is the keys (strings) and indices
// (numbers) from the value's top; Value is "nan", "inf" or "-inf".
type Nonfinite struct {
	Path  []any
	Value string
}

// Nonfinites are the places of a value's NaNs and infinities, as the harness
// sends them: [[path, value], ...].
type Nonfinites []Nonfinite

// UnmarshalJSON reads the places as the harness writes them, with one decoder
// for them all (one for each cost 8 µs a place); a place that is not [path,
// value] is an error.
func (n *Nonfinites) UnmarshalJSON(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var places [][]any
	if err := dec.Decode(&places); err != nil {
		return fmt.Errorf("the places of non-finite floats: %w", err)
	}
	out := make(Nonfinites, 0, len(places))
	for _, p := range places {
		if len(p) != 2 {
			return fmt.Errorf("a non-finite float's place is not [path, value]: %v", p)
		}
		path, ok := p[0].([]any)
		value, ok2 := p[1].(string)
		if !ok || !ok2 {
			return fmt.Errorf("a non-finite float's place is not [path, value]: %v", p)
		}
		out = append(out, Nonfinite{Path: path, Value: value})
	}
	*n = out
	return nil
}

// WithNonfinite returns the values of Event.Data that raw, a JSON value,
// holds, with the floats of places put back where raw has null. A place
// that names nothing, or something other than null, or a value other than
// "nan", "inf" and "-inf", is ignored: the harness is trusted to send
// them, not to send them right. Without places it returns raw itself.
func WithNonfinite(raw json.RawMessage, places Nonfinites) (any, error) {
	if len(places) == 0 {
		return raw, nil
	}
	v, err := decodeRawJSON(raw)
	if err != nil {
		return nil, err
	}
	for _, p := range places {
		switch p.Value {
		case "nan":
			v = putFloat(v, p.Path, math.NaN())
		case "inf":
			v = putFloat(v, p.Path, math.Inf(1))
		case "-inf":
			v = putFloat(v, p.Path, math.Inf(-1))
		}
	}
	return v, nil
}

// putFloat returns v with f where path leads to a null.
func putFloat(v any, path []any, f float64) any {
	if len(path) == 0 {
		if v == nil {
			return f
		}
		return v
	}
	switch x := v.(type) {
	case map[string]any:
		if k, ok := path[0].(string); ok {
			if e, ok := x[k]; ok {
				x[k] = putFloat(e, path[1:], f)
			}
		}
	case []any:
		if n, ok := path[0].(json.Number); ok {
			if i, err := n.Int64(); err == nil && i >= 0 && i < int64(len(x)) {
				x[i] = putFloat(x[i], path[1:], f)
			}
		}
	}
	return v
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
