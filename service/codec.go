package service

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// jsonCodec is the JSON codec of the API, in place of Connect's own, which
// ignores unknown fields. A JSON body with a field the server does not know
// is refused (INVALID_ARGUMENT, "unknown field"): a misspelt field ("buyr",
// "quantity") must not pass silently as an absent one, and a field from a
// newer API version must not be dropped by an older server that cannot
// honour it. (Binary protobuf keeps protobuf's rules: generated clients
// cannot misspell.)
//
// Answers carry every field, zero values included ("replayed": false), so
// that callers in untyped languages see a stable shape; names are the
// proto3 JSON mapping's lowerCamelCase (routeKey, holdId), as in the CLI's
// JSON, and requests may use either that or the proto's snake_case names.
// 64-bit integers are strings in answers (proto3 JSON mapping) and may be
// numbers or strings in requests.
type jsonCodec struct{ name string }

func (c jsonCodec) Name() string { return c.name }

func (c jsonCodec) Marshal(m any) ([]byte, error) {
	pm, ok := m.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("%T is not a protobuf message", m)
	}
	return protojson.MarshalOptions{EmitUnpopulated: true}.Marshal(pm)
}

func (c jsonCodec) Unmarshal(data []byte, m any) error {
	pm, ok := m.(proto.Message)
	if !ok {
		return fmt.Errorf("%T is not a protobuf message", m)
	}
	if len(data) == 0 {
		return errors.New("empty body: a request is a JSON object, {} at least")
	}
	if err := (protojson.UnmarshalOptions{}).Unmarshal(data, pm); err != nil {
		return fmt.Errorf("unmarshal %s: %w", pm.ProtoReflect().Descriptor().FullName(), err)
	}
	return nil
}
