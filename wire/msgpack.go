package wire

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"reflect"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// This file holds the msgpack side of the codec. The msgpack library decodes
// and encodes single values; the structure around them is walked here, so
// that a bad message gets an error naming its field, and a hostile one
// cannot make the decoder allocate what the input announces rather than what
// it holds.

const (
	// maxDepth bounds the nesting of arrays and maps in a message, in both
	// encodings: the same limit as encoding/json.
	maxDepth = 10000

	// allocHint caps the capacity allocated up front for an array or map
	// whose length the input announces; longer ones grow as they are read.
	allocHint = 1024
)

// encodeMsgpack encodes v with sorted map keys and compact integers.
func encodeMsgpack(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.SetSortMapKeys(true)
	enc.UseCompactInts(true)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// decodeMsgpack checks that b holds exactly one msgpack map (see
// scanMsgpack) and decodes it into the struct ptr points to.
func decodeMsgpack(b []byte, ptr any) error {
	if err := scanMsgpack(b); err != nil {
		return err
	}
	return decodeStruct(msgpack.NewDecoder(bytes.NewReader(b)), ptr)
}

// scanMsgpack walks b without allocating and checks that it holds exactly one
// msgpack value, that this value is a map, that no string, binary or
// extension is longer than the bytes left, that no array or map announces
// more elements than bytes are left (every element takes at least one byte),
// and that arrays and maps nest at most maxDepth deep. After it, decoding
// allocates in proportion to len(b), whatever lengths b claims.
func scanMsgpack(b []byte) error {
	if len(b) == 0 {
		return errors.New("empty input")
	}
	if c := b[0]; !isMapCode(c) {
		if c == '{' {
			return errors.New("want a map at the top, got the byte '{', which starts a JSON object (is the Content-Type header wrong?)")
		}
		return fmt.Errorf("want a map at the top, got %s", describeCode(c))
	}

	var (
		pos   int
		left  = 1   // values still to read in the innermost open container
		stack []int // values left in the enclosing containers
	)
	for {
		start := pos
		c := b[pos]
		pos++

		var (
			payload uint64 // bytes that follow the code and length
			n       uint64 // values inside, for an array or map
			lenSize int    // bytes of the length field
		)
		switch {
		case msgpcode.IsFixedNum(c), c == msgpcode.Nil, c == msgpcode.False, c == msgpcode.True:
		case msgpcode.IsFixedMap(c):
			n = 2 * uint64(c&msgpcode.FixedMapMask)
		case msgpcode.IsFixedArray(c):
			n = uint64(c & msgpcode.FixedArrayMask)
		case msgpcode.IsFixedString(c):
			payload = uint64(c & msgpcode.FixedStrMask)
		case c == msgpcode.Uint8, c == msgpcode.Int8:
			payload = 1
		case c == msgpcode.Uint16, c == msgpcode.Int16:
			payload = 2
		case c == msgpcode.Uint32, c == msgpcode.Int32, c == msgpcode.Float:
			payload = 4
		case c == msgpcode.Uint64, c == msgpcode.Int64, c == msgpcode.Double:
			payload = 8
		case c == msgpcode.FixExt1:
			payload = 1 + 1 // type byte and data
		case c == msgpcode.FixExt2:
			payload = 1 + 2
		case c == msgpcode.FixExt4:
			payload = 1 + 4
		case c == msgpcode.FixExt8:
			payload = 1 + 8
		case c == msgpcode.FixExt16:
			payload = 1 + 16
		case c == msgpcode.Str8, c == msgpcode.Bin8, c == msgpcode.Ext8:
			lenSize = 1
		case c == msgpcode.Str16, c == msgpcode.Bin16, c == msgpcode.Ext16, c == msgpcode.Array16, c == msgpcode.Map16:
			lenSize = 2
		case c == msgpcode.Str32, c == msgpcode.Bin32, c == msgpcode.Ext32, c == msgpcode.Array32, c == msgpcode.Map32:
			lenSize = 4
		default:
			return fmt.Errorf("at byte %d: 0x%02x is not a msgpack type code", start, c)
		}

		if lenSize > 0 {
			if len(b)-pos < lenSize {
				return truncated(start)
			}
			var l uint64
			switch lenSize {
			case 1:
				l = uint64(b[pos])
			case 2:
				l = uint64(binary.BigEndian.Uint16(b[pos:]))
			case 4:
				l = uint64(binary.BigEndian.Uint32(b[pos:]))
			}
			pos += lenSize
			switch c {
			case msgpcode.Array16, msgpcode.Array32:
				n = l
			case msgpcode.Map16, msgpcode.Map32:
				n = 2 * l
			case msgpcode.Ext8, msgpcode.Ext16, msgpcode.Ext32:
				payload = 1 + l
			default:
				payload = l
			}
		}

		rest := uint64(len(b) - pos)
		if payload > rest {
			return fmt.Errorf("at byte %d: %s of %d bytes runs past the end of the input (%d left): the message is truncated", start, describeCode(c), payload, rest)
		}
		pos += int(payload)
		if n > rest {
			what := fmt.Sprintf("an array of %d elements", n)
			if isMapCode(c) {
				what = fmt.Sprintf("a map of %d entries", n/2)
			}
			return fmt.Errorf("at byte %d: %s cannot fit in the %d bytes left: the message is truncated or the length is wrong", start, what, rest)
		}

		left--
		if n > 0 {
			if len(stack) >= maxDepth {
				return fmt.Errorf("at byte %d: arrays and maps nest deeper than %d levels", start, maxDepth)
			}
			stack = append(stack, left)
			left = int(n)
		}
		for left == 0 && len(stack) > 0 {
			left = stack[len(stack)-1]
			stack = stack[:len(stack)-1]
		}
		if left == 0 {
			break
		}
		if pos == len(b) {
			return truncated(pos)
		}
	}
	if pos != len(b) {
		return fmt.Errorf("at byte %d: %d bytes of trailing data after the message", pos, len(b)-pos)
	}
	return nil
}

func truncated(pos int) error {
	return fmt.Errorf("at byte %d: unexpected end of input: the message is truncated", pos)
}

// structFields maps a struct type to the index of each field by its msgpack
// name.
var structFields sync.Map // reflect.Type -> map[string]int

func fieldsOf(t reflect.Type) map[string]int {
	if f, ok := structFields.Load(t); ok {
		return f.(map[string]int)
	}
	m := make(map[string]int, t.NumField())
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("msgpack"), ",")
		if name != "" && name != "-" {
			m[name] = i
		}
	}
	structFields.Store(t, m)
	return m
}

// decodeStruct decodes a msgpack map into the struct ptr points to, field by
// field by msgpack tag name. Unknown keys are skipped; nil leaves a field at
// its zero value, as null does in JSON.
func decodeStruct(dec *msgpack.Decoder, ptr any) error {
	v := reflect.ValueOf(ptr).Elem()
	fields := fieldsOf(v.Type())

	c, err := peek(dec)
	if err != nil {
		return err
	}
	if c == msgpcode.Nil {
		return dec.DecodeNil()
	}
	if !isMapCode(c) {
		return fmt.Errorf("want a map, got %s", describeCode(c))
	}
	n, err := dec.DecodeMapLen()
	if err != nil {
		return eofError(err)
	}
	for i := range n {
		key, err := decodeKey(dec)
		if err != nil {
			return fmt.Errorf("key %d: %w", i, err)
		}
		idx, ok := fields[key]
		if !ok {
			if err := skipValue(dec, 1); err != nil {
				return fmt.Errorf("field %s: %w", quote(key), err)
			}
			continue
		}
		if err := decodeField(dec, v.Field(idx)); err != nil {
			return fmt.Errorf("field %s: %w", quote(key), err)
		}
	}
	return nil
}

// decodeField decodes one value into f, checking that its msgpack type fits
// f's Go type.
func decodeField(dec *msgpack.Decoder, f reflect.Value) error {
	if d, ok := f.Addr().Interface().(msgpack.CustomDecoder); ok {
		return d.DecodeMsgpack(dec)
	}
	c, err := peek(dec)
	if err != nil {
		return err
	}
	if c == msgpcode.Nil {
		f.SetZero()
		return dec.DecodeNil()
	}

	switch t := f.Type(); t.Kind() {
	case reflect.String:
		s, err := decodeString(dec, c)
		if err != nil {
			return err
		}
		f.SetString(s)

	case reflect.Bool:
		if c != msgpcode.True && c != msgpcode.False {
			return wantError("a boolean", c)
		}
		b, err := dec.DecodeBool()
		if err != nil {
			return eofError(err)
		}
		f.SetBool(b)

	case reflect.Float64:
		var x float64
		switch {
		case isUintCode(c): // DecodeFloat64 would wrap those above math.MaxInt64
			var u uint64
			u, err = dec.DecodeUint64()
			x = float64(u)
		case isIntCode(c), c == msgpcode.Float, c == msgpcode.Double:
			x, err = dec.DecodeFloat64()
		default:
			return wantError("a number", c)
		}
		if err != nil {
			return eofError(err)
		}
		if !isFinite(x) {
			return fmt.Errorf("%v is not a number JSON can carry", x)
		}
		f.SetFloat(x)

	case reflect.Int, reflect.Int64:
		var x int64
		switch {
		case isIntCode(c):
			x, err = dec.DecodeInt64()
		case isUintCode(c):
			var u uint64
			u, err = dec.DecodeUint64()
			if err == nil && u > math.MaxInt64 {
				return fmt.Errorf("%d is too large for a signed 64-bit integer", u)
			}
			x = int64(u)
		default:
			return wantError("an integer", c)
		}
		if err != nil {
			return eofError(err)
		}
		if f.OverflowInt(x) {
			return fmt.Errorf("%d is too large for %s", x, t)
		}
		f.SetInt(x)

	case reflect.Uint64:
		var x uint64
		switch {
		case isUintCode(c):
			x, err = dec.DecodeUint64()
		case isIntCode(c):
			var i int64
			i, err = dec.DecodeInt64()
			if err == nil && i < 0 {
				return fmt.Errorf("%d is negative, want a non-negative integer", i)
			}
			x = uint64(i)
		default:
			return wantError("a non-negative integer", c)
		}
		if err != nil {
			return eofError(err)
		}
		f.SetUint(x)

	case reflect.Pointer:
		p := reflect.New(t.Elem())
		if err := decodeField(dec, p.Elem()); err != nil {
			return err
		}
		f.Set(p)

	case reflect.Slice:
		if t.Elem().Kind() != reflect.String {
			return fmt.Errorf("internal error: cannot decode into %s", t)
		}
		if !isArrayCode(c) {
			return wantError("an array of strings", c)
		}
		n, err := dec.DecodeArrayLen()
		if err != nil {
			return eofError(err)
		}
		s := make([]string, 0, min(n, allocHint))
		for i := range n {
			var e string
			c, err := peek(dec)
			if err != nil {
				return err
			}
			if c == msgpcode.Nil {
				err = dec.DecodeNil()
			} else {
				e, err = decodeString(dec, c)
			}
			if err != nil {
				return fmt.Errorf("element %d: %w", i, err)
			}
			s = append(s, e)
		}
		f.Set(reflect.ValueOf(s).Convert(t))

	case reflect.Map:
		if t.Key().Kind() != reflect.String || t.Elem().Kind() != reflect.String {
			return fmt.Errorf("internal error: cannot decode into %s", t)
		}
		if !isMapCode(c) {
			return wantError("a map of strings", c)
		}
		n, err := dec.DecodeMapLen()
		if err != nil {
			return eofError(err)
		}
		m := make(map[string]string, min(n, allocHint))
		for i := range n {
			k, err := decodeKey(dec)
			if err != nil {
				return fmt.Errorf("key %d: %w", i, err)
			}
			c, err := peek(dec)
			if err != nil {
				return err
			}
			var v string
			if c == msgpcode.Nil {
				err = dec.DecodeNil()
			} else {
				v, err = decodeString(dec, c)
			}
			if err != nil {
				return fmt.Errorf("key %s: %w", quote(k), err)
			}
			m[k] = v
		}
		f.Set(reflect.ValueOf(m).Convert(t))

	default:
		return fmt.Errorf("internal error: cannot decode into %s", t)
	}
	return nil
}

// decodeValue decodes any msgpack value into the generic values of
// Event.Data: nil, bool, string, int64, uint64 (above math.MaxInt64 only),
// float64, []any and map[string]any.
func decodeValue(dec *msgpack.Decoder, depth int) (any, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("arrays and maps nest deeper than %d levels", maxDepth)
	}
	c, err := peek(dec)
	if err != nil {
		return nil, err
	}
	switch {
	case c == msgpcode.Nil:
		return nil, dec.DecodeNil()
	case c == msgpcode.True || c == msgpcode.False:
		b, err := dec.DecodeBool()
		return b, eofError(err)
	case isIntCode(c):
		i, err := dec.DecodeInt64()
		return i, eofError(err)
	case isUintCode(c):
		u, err := dec.DecodeUint64()
		if err != nil {
			return nil, eofError(err)
		}
		if u <= math.MaxInt64 {
			return int64(u), nil
		}
		return u, nil
	case c == msgpcode.Float || c == msgpcode.Double:
		x, err := dec.DecodeFloat64()
		if err != nil {
			return nil, eofError(err)
		}
		if !isFinite(x) {
			return nil, fmt.Errorf("%v is not a number JSON can carry", x)
		}
		return x, nil
	case msgpcode.IsString(c) || msgpcode.IsBin(c):
		s, err := decodeString(dec, c)
		if err != nil {
			return nil, err
		}
		return s, nil
	case isArrayCode(c):
		n, err := dec.DecodeArrayLen()
		if err != nil {
			return nil, eofError(err)
		}
		s := make([]any, 0, min(n, allocHint))
		for i := range n {
			v, err := decodeValue(dec, depth+1)
			if err != nil {
				return nil, fmt.Errorf("[%d]: %w", i, err)
			}
			s = append(s, v)
		}
		return s, nil
	case isMapCode(c):
		n, err := dec.DecodeMapLen()
		if err != nil {
			return nil, eofError(err)
		}
		m := make(map[string]any, min(n, allocHint))
		for i := range n {
			k, err := decodeKey(dec)
			if err != nil {
				return nil, fmt.Errorf("key %d: %w", i, err)
			}
			v, err := decodeValue(dec, depth+1)
			if err != nil {
				return nil, fmt.Errorf("[%s]: %w", quote(k), err)
			}
			m[k] = v
		}
		return m, nil
	default:
		return nil, fmt.Errorf("got %s, which JSON cannot carry", describeCode(c))
	}
}

// encodeValue encodes a value of Event.Data (see decodeValue) with sorted map
// keys, converting json.RawMessage and json.Number into the values they hold.
// Values of other types are left to the msgpack library.
func encodeValue(enc *msgpack.Encoder, v any, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("arrays and maps nest deeper than %d levels", maxDepth)
	}
	switch v := v.(type) {
	case nil:
		return enc.EncodeNil()
	case bool:
		return enc.EncodeBool(v)
	case string:
		return enc.EncodeString(v)
	case int:
		return enc.EncodeInt(int64(v))
	case int8:
		return enc.EncodeInt(int64(v))
	case int16:
		return enc.EncodeInt(int64(v))
	case int32:
		return enc.EncodeInt(int64(v))
	case int64:
		return enc.EncodeInt(v)
	case uint:
		return enc.EncodeUint(uint64(v))
	case uint8:
		return enc.EncodeUint(uint64(v))
	case uint16:
		return enc.EncodeUint(uint64(v))
	case uint32:
		return enc.EncodeUint(uint64(v))
	case uint64:
		return enc.EncodeUint(v)
	case float32:
		if !isFinite(float64(v)) {
			return fmt.Errorf("%v is not a number JSON can carry", v)
		}
		return enc.EncodeFloat32(v)
	case float64:
		if !isFinite(v) {
			return fmt.Errorf("%v is not a number JSON can carry", v)
		}
		return enc.EncodeFloat64(v)
	case []any:
		if v == nil {
			return enc.EncodeNil()
		}
		if err := enc.EncodeArrayLen(len(v)); err != nil {
			return err
		}
		for _, e := range v {
			if err := encodeValue(enc, e, depth+1); err != nil {
				return err
			}
		}
		return nil
	case map[string]any:
		if v == nil {
			return enc.EncodeNil()
		}
		if err := enc.EncodeMapLen(len(v)); err != nil {
			return err
		}
		for _, k := range slices.Sorted(maps.Keys(v)) {
			if err := enc.EncodeString(k); err != nil {
				return err
			}
			if err := encodeValue(enc, v[k], depth+1); err != nil {
				return err
			}
		}
		return nil
	case json.Number:
		n, err := parseNumber(string(v))
		if err != nil {
			return err
		}
		return encodeValue(enc, n, depth)
	case json.RawMessage:
		if len(v) == 0 {
			return enc.EncodeNil()
		}
		if !utf8.Valid(v) {
			return errors.New("raw JSON data is not valid UTF-8")
		}
		x, err := decodeJSONValue(v)
		if err != nil {
			return fmt.Errorf("raw JSON data: %w", err)
		}
		return encodeValue(enc, x, depth)
	default:
		return enc.Encode(v)
	}
}

// skipValue skips one value, like Decoder.Skip but with a bound on nesting.
func skipValue(dec *msgpack.Decoder, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("arrays and maps nest deeper than %d levels", maxDepth)
	}
	c, err := peek(dec)
	if err != nil {
		return err
	}
	var n int
	switch {
	case isArrayCode(c):
		if n, err = dec.DecodeArrayLen(); err != nil {
			return eofError(err)
		}
	case isMapCode(c):
		if n, err = dec.DecodeMapLen(); err != nil {
			return eofError(err)
		}
		n *= 2
	default:
		return eofError(dec.Skip())
	}
	for range n {
		if err := skipValue(dec, depth+1); err != nil {
			return err
		}
	}
	return nil
}

// decodeString decodes a msgpack string or binary (whose code c the caller
// peeked) that must be valid UTF-8.
func decodeString(dec *msgpack.Decoder, c byte) (string, error) {
	if !msgpcode.IsString(c) && !msgpcode.IsBin(c) {
		return "", wantError("a string", c)
	}
	s, err := dec.DecodeString()
	if err != nil {
		return "", eofError(err)
	}
	if !utf8.ValidString(s) {
		return "", fmt.Errorf("string %s is not valid UTF-8", quote(s))
	}
	return s, nil
}

// decodeKey decodes a map key, which must be a string.
func decodeKey(dec *msgpack.Decoder) (string, error) {
	c, err := peek(dec)
	if err != nil {
		return "", err
	}
	if !msgpcode.IsString(c) && !msgpcode.IsBin(c) {
		return "", fmt.Errorf("map keys must be strings, got %s", describeCode(c))
	}
	return decodeString(dec, c)
}

func peek(dec *msgpack.Decoder) (byte, error) {
	c, err := dec.PeekCode()
	return c, eofError(err)
}

// eofError turns the io errors of a short input into a readable one.
func eofError(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return errors.New("unexpected end of input: the message is truncated")
	}
	return err
}

func wantError(want string, c byte) error {
	return fmt.Errorf("want %s, got %s", want, describeCode(c))
}

func isMapCode(c byte) bool {
	return msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32
}

func isArrayCode(c byte) bool {
	return msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32
}

// isIntCode reports a signed integer: a fixnum or int8 to int64.
func isIntCode(c byte) bool {
	return msgpcode.IsFixedNum(c) || c >= msgpcode.Int8 && c <= msgpcode.Int64
}

func isUintCode(c byte) bool {
	return c >= msgpcode.Uint8 && c <= msgpcode.Uint64
}

// describeCode names the msgpack type of code c for an error message.
func describeCode(c byte) string {
	switch {
	case c == msgpcode.Nil:
		return "nil"
	case c == msgpcode.True || c == msgpcode.False:
		return "a boolean"
	case isIntCode(c) || isUintCode(c):
		return "an integer"
	case c == msgpcode.Float || c == msgpcode.Double:
		return "a float"
	case msgpcode.IsString(c):
		return "a string"
	case msgpcode.IsBin(c):
		return "binary data"
	case isArrayCode(c):
		return "an array"
	case isMapCode(c):
		return "a map"
	case msgpcode.IsExt(c):
		return "an extension type"
	default:
		return fmt.Sprintf("the invalid code 0x%02x", c)
	}
}
