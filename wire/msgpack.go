package wire

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// The msgpack library encodes and decodes jobs and events by their struct
// tags. This file holds what it cannot do: check a message as a whole before
// it is decoded, so that a hostile one cannot make the library allocate the
// lengths it announces or recurse without bound, and so that a value of the
// wrong type gets an error naming its field, where the library would convert
// it silently (a float into an integer field) or name only a Go type.

// maxDepth bounds the nesting of arrays and maps in a message, in both
// encodings: the same limit as encoding/json.
const maxDepth = 10000

// encodeMsgpack encodes v with sorted map keys and compact integers.
func encodeMsgpack(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := msgpack.GetEncoder()
	defer msgpack.PutEncoder(enc)
	enc.Reset(&buf)
	enc.SetSortMapKeys(true)
	enc.UseCompactInts(true)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// decodeMsgpack checks b with scan against fields, the kinds of the fields of
// the struct ptr points to, and decodes it into that struct.
func decodeMsgpack(b []byte, fields map[string]kind, ptr any) error {
	if err := scan(b, fields); err != nil {
		return err
	}
	dec := msgpack.GetDecoder()
	defer msgpack.PutDecoder(dec)
	dec.Reset(bytes.NewReader(b))
	dec.UseLooseInterfaceDecoding(true) // int64, uint64, float64 and string in Event.Data
	return dec.Decode(ptr)
}

// A kind is what a field of a message may hold, for the checks of scan.
type kind uint8

const (
	anyKind       kind = iota // an unknown field or its contents: not checked
	keyKind                   // a map key: a string
	stringKind                // string
	boolKind                  // bool
	numberKind                // float64
	intKind                   // int, int64
	uintKind                  // uint64
	stringsKind               // []string
	stringMapKind             // map[string]string
	valueKind                 // Event.Data: JSON-like values
	bytesKind                 // []byte: binary or a string, any bytes
	filesKind                 // []File: an array of maps
	fileKind                  // File: a map of fileFields
)

// kindWords names what a kind wants, in error messages of both encodings.
var kindWords = [...]string{
	stringKind: "a string", boolKind: "a boolean", numberKind: "a number", intKind: "an integer",
	uintKind: "a non-negative integer", stringsKind: "an array of strings", stringMapKind: "a map of strings",
	bytesKind: "binary data", filesKind: "an array of maps", fileKind: "a map",
}

var (
	jobFields   = fieldKinds(reflect.TypeFor[Job]())
	eventFields = fieldKinds(reflect.TypeFor[eventWire]())
	fileFields  = fieldKinds(reflect.TypeFor[File]())
)

// fieldKinds maps the msgpack name of each field of struct type t to its
// kind (a test checks that every field has one).
func fieldKinds(t reflect.Type) map[string]kind {
	m := make(map[string]kind, t.NumField())
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("msgpack"), ",")
		m[name] = kindOf(t.Field(i).Type)
	}
	return m
}

func kindOf(t reflect.Type) kind {
	if t == reflect.TypeFor[value]() {
		return valueKind
	}
	switch t.Kind() {
	case reflect.Pointer:
		return kindOf(t.Elem())
	case reflect.String:
		return stringKind
	case reflect.Bool:
		return boolKind
	case reflect.Float64:
		return numberKind
	case reflect.Int, reflect.Int64:
		return intKind
	case reflect.Uint64:
		return uintKind
	case reflect.Slice:
		switch {
		case t.Elem().Kind() == reflect.String:
			return stringsKind
		case t.Elem().Kind() == reflect.Uint8:
			return bytesKind
		case t.Elem() == reflect.TypeFor[File]():
			return filesKind
		}
	case reflect.Map:
		if t.Key().Kind() == reflect.String && t.Elem().Kind() == reflect.String {
			return stringMapKind
		}
	}
	return anyKind
}

// scan walks b without allocating and checks that it holds exactly one
// msgpack value, a map; that no string, binary or extension is longer than
// the bytes left, and no array or map announces more elements than bytes are
// left (every element takes at least one byte); that arrays and maps nest at
// most maxDepth deep; and that the known fields (those in fields) hold what
// their kinds allow, as strictly as encoding/json would: no integer from a
// float, no string that is not UTF-8, no NaN. After it, the library
// allocates in proportion to len(b), whatever lengths b announces.
//
// An error in the structure of b wins over an error in the type of a field,
// wherever the two are.
func scan(b []byte, fields map[string]kind) error {
	if len(b) == 0 {
		return errors.New("empty input")
	}
	if f, _, _ := classify(b[0]); f != fMap {
		if b[0] == '{' {
			return errors.New("want a map at the top, got the byte '{', which starts a JSON object (is the Content-Type header wrong?)")
		}
		return fmt.Errorf("want a map at the top, got %s", describeCode(b[0]))
	}
	s := scanner{b: b, fields: fields}
	err := s.value(anyKind, 0)
	if err == nil && s.pos != len(b) {
		return fmt.Errorf("at byte %d: %d bytes of trailing data after the message", s.pos, len(b)-s.pos)
	}
	if s.badType {
		if structural := scan(b, nil); structural != nil {
			return structural
		}
		slices.Reverse(s.path)
		return fmt.Errorf("%s%w", strings.Join(s.path, ""), err)
	}
	return err
}

// scanner is the state of scan.
type scanner struct {
	b       []byte
	pos     int
	fields  map[string]kind // of the top-level map; nil checks no types
	data    []byte          // the data of the last value, such as the bytes of a string
	badType bool            // the error is about a type, not the structure
	path    []string        // where the type error is, from the inside out
}

// value checks the value at s.pos, of kind k, inside depth arrays and maps.
func (s *scanner) value(k kind, depth int) error {
	start := s.pos
	if start == len(s.b) {
		return truncated(start)
	}
	c := s.b[start]
	f, size, lenSize := classify(c)
	if f == fInvalid {
		return fmt.Errorf("at byte %d: 0x%02x is not a msgpack type code", start, c)
	}
	s.pos++
	if lenSize > 0 {
		if len(s.b)-s.pos < lenSize {
			return truncated(start)
		}
		size += uintOf(s.b[s.pos : s.pos+lenSize])
		s.pos += lenSize
	}
	n := uint64(0) // values inside
	if f == fArray || f == fMap {
		n, size = size<<(f-fArray), 0 // a map holds a key and a value for each entry
	}
	if rest := uint64(len(s.b) - s.pos); size > rest {
		return fmt.Errorf("at byte %d: %s of %d bytes runs past the end of the input (%d left): the message is truncated", start, describeCode(c), size, rest)
	} else if n > rest {
		what := fmt.Sprintf("an array of %d elements", n)
		if f == fMap {
			what = fmt.Sprintf("a map of %d entries", n/2)
		}
		return fmt.Errorf("at byte %d: %s cannot fit in the %d bytes left: the message is truncated or the length is wrong", start, what, rest)
	}
	s.data = s.b[s.pos : s.pos+int(size)]
	s.pos += int(size)
	if k != anyKind {
		if err := check(k, f, c, s.data); err != nil {
			s.badType = true
			return err
		}
	}
	switch {
	case n == 0:
		return nil
	case depth >= maxDepth:
		return fmt.Errorf("at byte %d: arrays and maps nest deeper than %d levels", start, maxDepth)
	case f == fArray:
		return s.elements(k, int(n), depth+1)
	}
	return s.entries(k, int(n/2), depth+1, depth == 0 && s.fields != nil)
}

// elements checks the n elements of an array of kind k.
func (s *scanner) elements(k kind, n, depth int) error {
	elem, where := anyKind, "[%d]: "
	switch k {
	case stringsKind:
		elem, where = stringKind, "element %d: "
	case filesKind:
		elem, where = fileKind, "element %d: "
	case valueKind:
		elem = valueKind
	}
	for i := range n {
		if err := s.value(elem, depth); err != nil {
			return s.at(err, where, i)
		}
	}
	return nil
}

// entries checks the n entries of a map of kind k; top is the map of the
// message, whose values have the kinds of s.fields.
func (s *scanner) entries(k kind, n, depth int, top bool) error {
	key, elem, where := anyKind, anyKind, "[%s]: "
	switch {
	case top:
		key, where = keyKind, "field %s: "
	case k == stringMapKind:
		key, elem, where = keyKind, stringKind, "key %s: "
	case k == fileKind:
		key, where = keyKind, "field %s: "
	case k == valueKind:
		key, elem = keyKind, valueKind
	}
	for i := range n {
		if err := s.value(key, depth); err != nil {
			return s.at(err, "key %d: ", i)
		}
		name := s.data
		switch {
		case top:
			elem = s.fields[string(name)]
		case k == fileKind:
			elem = fileFields[string(name)]
		}
		if err := s.value(elem, depth); err != nil {
			return s.at(err, where, quote(string(name)))
		}
	}
	return nil
}

// at notes where the type error err is, for scan to put in front of it once
// (wrapping it at each level would take time in the square of the depth);
// an error in the structure says where it is already.
func (s *scanner) at(err error, format string, where any) error {
	if s.badType {
		s.path = append(s.path, fmt.Sprintf(format, where))
	}
	return err
}

// check checks that a value of format f, code c and data holds what kind k
// allows. Nil is allowed everywhere but in a map key: it leaves a field empty.
func check(k kind, f format, c byte, data []byte) error {
	if f == fNil && k != keyKind {
		return nil
	}
	var ok bool
	switch k {
	case keyKind:
		if f != fStr && f != fBin {
			return fmt.Errorf("map keys must be strings, got %s", formatNames[f])
		}
		ok = true
	case stringKind:
		ok = f == fStr || f == fBin
	case boolKind:
		ok = f == fBool
	case numberKind:
		ok = f == fInt || f == fUint || f == fFloat
	case intKind:
		if f == fUint && uintOf(data) > math.MaxInt64 {
			return fmt.Errorf("%d is too large for a signed 64-bit integer", uintOf(data))
		}
		ok = f == fInt || f == fUint
	case uintKind:
		if f == fInt && intOf(c, data) < 0 {
			return fmt.Errorf("%d is negative, want a non-negative integer", intOf(c, data))
		}
		ok = f == fInt || f == fUint
	case stringsKind, stringMapKind, filesKind, fileKind:
		ok = f == fArray && (k == stringsKind || k == filesKind) || f == fMap && (k == stringMapKind || k == fileKind)
	case bytesKind:
		if f == fBin || f == fStr {
			return nil // any bytes, UTF-8 or not
		}
	case valueKind:
		if f == fExt {
			return fmt.Errorf("got %s, which JSON cannot carry", formatNames[f])
		}
		ok = true
	}
	switch {
	case !ok:
		return fmt.Errorf("want %s, got %s", kindWords[k], formatNames[f])
	case f == fFloat:
		x := math.Float64frombits(uintOf(data))
		if c == msgpcode.Float {
			x = float64(math.Float32frombits(uint32(uintOf(data))))
		}
		if !isFinite(x) {
			return fmt.Errorf("%v is not a number JSON can carry", x)
		}
	case (f == fStr || f == fBin) && !utf8.Valid(data):
		return fmt.Errorf("string %s is not valid UTF-8", quote(string(data)))
	}
	return nil
}

// A format is the msgpack type of a value, as the code that starts it says.
type format uint8

const (
	fInvalid format = iota
	fNil
	fBool
	fInt // signed: a fixnum or int8 to int64
	fUint
	fFloat
	fStr
	fBin
	fExt
	fArray // fMap must follow
	fMap
)

var formatNames = [...]string{fNil: "nil", fBool: "a boolean", fInt: "an integer", fUint: "an integer", fFloat: "a float",
	fStr: "a string", fBin: "binary data", fExt: "an extension type", fArray: "an array", fMap: "a map"}

// classify says what code c starts: its format and how long it is. size is
// the number of data bytes after the code, or, for an array or a map, of
// entries; lenSize, when not zero, is the number of bytes after the code that
// hold a length to add to size.
func classify(c byte) (f format, size uint64, lenSize int) {
	switch {
	case msgpcode.IsFixedNum(c):
		return fInt, 0, 0
	case msgpcode.IsFixedMap(c):
		return fMap, uint64(c & msgpcode.FixedMapMask), 0
	case msgpcode.IsFixedArray(c):
		return fArray, uint64(c & msgpcode.FixedArrayMask), 0
	case msgpcode.IsFixedString(c):
		return fStr, uint64(c & msgpcode.FixedStrMask), 0
	case c == msgpcode.Nil:
		return fNil, 0, 0
	case c == msgpcode.False || c == msgpcode.True:
		return fBool, 0, 0
	case c == msgpcode.Float || c == msgpcode.Double:
		return fFloat, 4 << (c - msgpcode.Float), 0
	case c >= msgpcode.Uint8 && c <= msgpcode.Uint64:
		return fUint, 1 << (c - msgpcode.Uint8), 0
	case c >= msgpcode.Int8 && c <= msgpcode.Int64:
		return fInt, 1 << (c - msgpcode.Int8), 0
	case c >= msgpcode.FixExt1 && c <= msgpcode.FixExt16:
		return fExt, 1 + 1<<(c-msgpcode.FixExt1), 0 // a type byte and the data
	case c >= msgpcode.Ext8 && c <= msgpcode.Ext32:
		return fExt, 1, 1 << (c - msgpcode.Ext8)
	case c >= msgpcode.Bin8 && c <= msgpcode.Bin32:
		return fBin, 0, 1 << (c - msgpcode.Bin8)
	case c >= msgpcode.Str8 && c <= msgpcode.Str32:
		return fStr, 0, 1 << (c - msgpcode.Str8)
	case c == msgpcode.Array16 || c == msgpcode.Array32:
		return fArray, 0, 2 << (c - msgpcode.Array16)
	case c == msgpcode.Map16 || c == msgpcode.Map32:
		return fMap, 0, 2 << (c - msgpcode.Map16)
	}
	return fInvalid, 0, 0
}

// describeCode names the msgpack type of code c for an error message.
func describeCode(c byte) string {
	if f, _, _ := classify(c); f != fInvalid {
		return formatNames[f]
	}
	return fmt.Sprintf("the invalid code 0x%02x", c)
}

// uintOf reads a big-endian unsigned integer of 1, 2, 4 or 8 bytes.
func uintOf(b []byte) uint64 {
	var u uint64
	for _, c := range b {
		u = u<<8 | uint64(c)
	}
	return u
}

// intOf reads the signed integer of code c (a fixnum or int8 to int64).
func intOf(c byte, data []byte) int64 {
	if msgpcode.IsFixedNum(c) {
		return int64(int8(c))
	}
	shift := 64 - 8*len(data)
	return int64(uintOf(data)<<shift) >> shift
}

func truncated(pos int) error {
	return fmt.Errorf("at byte %d: unexpected end of input: the message is truncated", pos)
}

// jobWire decodes a job. In msgpack, its timeout_sec shadows the Job's and
// decodes as a number, where the library would wrap an unsigned integer
// above math.MaxInt64 around to a negative float. JSON decodes into the Job.
type jobWire struct {
	TimeoutSec number `msgpack:"timeout_sec"`
	Job        `msgpack:",inline"`
}

func (w *jobWire) job() *Job {
	j := &w.Job
	if w.TimeoutSec != 0 {
		j.TimeoutSec = float64(w.TimeoutSec)
	}
	if len(j.RequiredSecrets) == 0 {
		j.RequiredSecrets = nil
	}
	if len(j.Metadata) == 0 {
		j.Metadata = nil
	}
	if len(j.Files) == 0 {
		j.Files = nil
	}
	if len(j.Artifacts) == 0 {
		j.Artifacts = nil
	}
	return j
}

// number is a float64 that decodes from any msgpack integer as it is.
type number float64

func (n *number) DecodeMsgpack(dec *msgpack.Decoder) error {
	v, err := dec.DecodeInterfaceLoose()
	switch v := v.(type) {
	case uint64:
		*n = number(v)
	case int64:
		*n = number(v)
	case float64:
		*n = number(v)
	}
	return err
}
