package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"reflect"
	"strings"
	"unicode/utf8"
)

// Content types of jobs and events, the values of the Content-Type header.
const (
	// ContentTypeMsgpack is the default encoding: a message without a
	// Content-Type header is msgpack.
	ContentTypeMsgpack = "application/msgpack"
	// ContentTypeJSON is the JSON encoding.
	ContentTypeJSON = "application/json"
)

// ParseContentType returns the content type that a Content-Type header
// names: [ContentTypeMsgpack] for an empty header, [ContentTypeMsgpack] or
// [ContentTypeJSON] otherwise. Case and parameters are ignored
// ("application/json; charset=utf-8"), except a charset other than UTF-8.
// Any other type is an error wrapping [ErrUnsupportedContentType].
func ParseContentType(header string) (string, error) {
	switch header { // the common cases, without allocating
	case "", ContentTypeMsgpack:
		return ContentTypeMsgpack, nil
	case ContentTypeJSON:
		return ContentTypeJSON, nil
	}
	mediaType, params, err := mime.ParseMediaType(header)
	if err != nil {
		return "", errorf(ErrUnsupportedContentType, "content type %s cannot be parsed: %v", quote(header), err)
	}
	switch mediaType {
	case ContentTypeMsgpack, ContentTypeJSON:
	default:
		return "", errorf(ErrUnsupportedContentType, "content type %s is not supported: use %q (the default) or %q", quote(header), ContentTypeMsgpack, ContentTypeJSON)
	}
	if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") && !strings.EqualFold(cs, "utf8") {
		return "", errorf(ErrUnsupportedContentType, "content type %s is not supported: the only charset is utf-8", quote(header))
	}
	return mediaType, nil
}

// encodingName names the encoding of a parsed content type in messages.
func encodingName(contentType string) string {
	if contentType == ContentTypeJSON {
		return "JSON"
	}
	return "msgpack"
}

// EncodeJob encodes j in the encoding that contentType names (see
// [ParseContentType]). It does not validate j; call [Job.Validate] first.
func EncodeJob(contentType string, j *Job) ([]byte, error) {
	ct, err := ParseContentType(contentType)
	if err != nil {
		return nil, err
	}
	if j == nil {
		return nil, errors.New("encode job: nil job")
	}
	b, err := encode(ct, j)
	if err != nil {
		return nil, fmt.Errorf("encode %s job %s: %w", encodingName(ct), quote(j.ExecutionID), err)
	}
	return b, nil
}

// DecodeJob decodes a job in the encoding that contentType names (see
// [ParseContentType]). The body must be a JSON object or a msgpack map;
// unknown fields are ignored, null or nil leaves a field empty, and strings
// must be UTF-8. Bytes that are not such a job give an error wrapping
// [ErrMalformed] that names the encoding and, when it can, the field.
//
// DecodeJob allocates in proportion to len(b), whatever lengths b announces;
// the caller bounds len(b) (the NATS max_payload does). The job is not
// validated; call [Job.Validate].
func DecodeJob(contentType string, b []byte) (*Job, error) {
	ct, err := ParseContentType(contentType)
	if err != nil {
		return nil, err
	}
	var w jobWire
	if ct == ContentTypeJSON {
		err = unmarshalJSON(b, &w.Job) // with the field names of its errors
	} else {
		err = decodeMsgpack(b, jobKind, &w)
	}
	if err != nil {
		return nil, errorf(ErrMalformed, "decode %s job: %w", encodingName(ct), err)
	}
	return w.job(), nil
}

// EncodeEvent encodes e in the encoding that contentType names (see
// [ParseContentType]); see [Event] for what its fields become. It fails
// when e.Data or e.FinalData cannot be encoded (NaN, invalid raw JSON) or
// e.Time is outside the years 0000-9999.
func EncodeEvent(contentType string, e *Event) ([]byte, error) {
	ct, err := ParseContentType(contentType)
	if err != nil {
		return nil, err
	}
	if e == nil {
		return nil, errors.New("encode event: nil event")
	}
	w, err := e.toWire(ct)
	var b []byte
	if err == nil {
		b, err = encode(ct, w)
	}
	if err != nil {
		return nil, fmt.Errorf("encode %s %s event %d of execution %s: %w", encodingName(ct), quote(e.Type), e.Seq, quote(e.ExecutionID), err)
	}
	return b, nil
}

// DecodeEvent decodes an event in the encoding that contentType names (see
// [ParseContentType]), with the rules of [DecodeJob]; see [Event] for the
// values Data and FinalData hold. Errors wrap [ErrMalformed].
func DecodeEvent(contentType string, b []byte) (*Event, error) {
	ct, err := ParseContentType(contentType)
	if err != nil {
		return nil, err
	}
	e := new(Event)
	if err := e.decode(ct, b); err != nil {
		return nil, errorf(ErrMalformed, "decode %s event: %w", encodingName(ct), err)
	}
	return e, nil
}

// encode encodes v, a job or the wire form of an event, as ct says.
func encode(ct string, v any) ([]byte, error) {
	if ct == ContentTypeJSON {
		return marshalJSON(v)
	}
	return encodeMsgpack(v)
}

// marshalJSON encodes v with encoding/json, without escaping <, > and & (the
// output of scripts is full of them, and nothing renders it as HTML).
func marshalJSON(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		// The errors of value.MarshalJSON say what is wrong and where.
		if me := (*json.MarshalerError)(nil); errors.As(err, &me) {
			return nil, me.Unwrap()
		}
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// unmarshalJSON decodes a JSON object into the struct ptr points to. Beyond
// json.Unmarshal it requires UTF-8 and an object at the top, and it words
// type errors like the msgpack decoder.
func unmarshalJSON(b []byte, ptr any) error {
	trimmed := bytes.TrimLeft(b, " \t\r\n")
	if len(trimmed) == 0 {
		return errors.New("empty input")
	}
	if c := trimmed[0]; c != '{' {
		if f, _, _ := classify(c); f == fMap {
			return fmt.Errorf("want a JSON object at the top, got the byte 0x%02x, which starts a msgpack map (is the Content-Type header wrong?)", c)
		}
		return fmt.Errorf("want a JSON object at the top, got %s", describeJSON(c))
	}
	if !utf8.Valid(b) {
		return errors.New("the JSON text is not valid UTF-8")
	}
	err := json.Unmarshal(b, ptr)
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		return fmt.Errorf("field %q: want %s, got a JSON %s", typeErr.Field, describeType(typeErr.Type), typeErr.Value)
	}
	return err
}

// describeJSON names the type of the JSON value that starts with c.
func describeJSON(c byte) string {
	switch c {
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 'n':
		return "null"
	case 't', 'f':
		return "a boolean"
	}
	if c == '-' || '0' <= c && c <= '9' {
		return "a number"
	}
	return fmt.Sprintf("the character %q", c)
}

// describeType names a field type as the msgpack errors do.
func describeType(t reflect.Type) string {
	if k := kindOf[t]; kinds[k].want != "" {
		return kinds[k].want
	}
	return t.String()
}
