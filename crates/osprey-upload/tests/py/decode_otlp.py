"""Decodes an OTLP ExportProfilesServiceRequest with the official generated
classes (PyPI opentelemetry-proto) and prints a JSON summary."""
import json
import sys

from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2

req = profiles_service_pb2.ExportProfilesServiceRequest()
req.ParseFromString(open(sys.argv[1], "rb").read())
d = req.dictionary
st = d.string_table


def anyval(v):
    k = v.WhichOneof("value")
    return getattr(v, k) if k else None


out = {"resources": []}
for rp in req.resource_profiles:
    res = {a.key: anyval(a.value) for a in rp.resource.attributes}
    profiles = []
    for sp in rp.scope_profiles:
        for p in sp.profiles:
            funcs = set()
            attrs = set()
            for s in p.samples:
                for li in d.stack_table[s.stack_index].location_indices:
                    for line in d.location_table[li].lines:
                        funcs.add(st[d.function_table[line.function_index].name_strindex])
                for ai in s.attribute_indices:
                    attrs.add(st[d.attribute_table[ai].key_strindex])
            profiles.append({
                "scope": sp.scope.name,
                "type": st[p.sample_type.type_strindex] + "/" + st[p.sample_type.unit_strindex],
                "period_type": st[p.period_type.type_strindex] + "/" + st[p.period_type.unit_strindex],
                "period": p.period,
                "samples": len(p.samples),
                "sum": sum(sum(s.values) for s in p.samples),
                "time_unix_nano": p.time_unix_nano,
                "duration_nano": p.duration_nano,
                "timestamps": sum(len(s.timestamps_unix_nano) for s in p.samples),
                "min_ts": min((t for s in p.samples for t in s.timestamps_unix_nano), default=0),
                "links": sorted({d.link_table[s.link_index].span_id.hex() for s in p.samples if s.link_index}),
                "link_traces": sorted({d.link_table[s.link_index].trace_id.hex() + "/" + d.link_table[s.link_index].span_id.hex()
                                       for s in p.samples if s.link_index}),
                "functions": sorted(funcs),
                "attributes": sorted(attrs),
            })
    out["resources"].append({"attributes": res, "profiles": profiles})
print(json.dumps(out))
