"""The generated picture of an env schema's shared-memory region (one source for the docs).

``shm_diagram(ir)`` is the ASCII diagram that the Python and TypeScript emitters write next to
the generated offsets and that ``transport-schema inspect`` prints: the region (control block,
slots, final areas) and, byte by byte, the control block, one slot (control words, request
area, result area, error text, info) and one final area. It is derived from the IR alone.
"""

from __future__ import annotations

from transport.schema.ir import COLUMN_ALIGN, SchemaIR, StructIR, shm_columns

_PART_OF_WORD = {"error_text": "error text", "info": "info"}


def shm_diagram(ir: SchemaIR) -> list[str]:
    """The lines of the region diagram of ``ir`` (empty for a schema without a shm layout)."""
    shm = ir.shm
    if shm is None:
        return []
    control, slot, final = (ir.structs[n] for n in (shm.control, shm.slot, shm.final))
    c, s, f = control.size, slot.size, final.size
    profile = "derived" if shm.profile == "derived" else f"profile {shm.profile}"
    profile = "column" if shm.columns else profile
    cells = [
        (f"{control.name} ({c})", "0"),
        (f"{slot.name} i ({s})", f"{c} + i*{s}"),
        ("...", ""),
        (f"{final.name} i ({f})", f"{c} + k*{s} + i*{f}"),
        ("...", ""),
    ]
    widths = [max(len(label), len(at)) + 2 for label, at in cells]
    rule = "  +" + "+".join("-" * w for w in widths) + "+"
    head = [
        f"shm region of schema {ir.name} ({profile} layout): k slots, k >= num_envs",
        "",
        "  " + "".join(at.ljust(w + 1) for (_, at), w in zip(cells, widths, strict=True)).rstrip(),
        rule,
        "  |"
        + "|".join(f" {label}".ljust(w) for (label, _), w in zip(cells, widths, strict=True))
        + "|",
        rule,
        f"  region size = {c} + k * ({s} + {f}) bytes",
    ]
    if shm.columns:
        head[-1] = f"  columns from C0(k) = {c} + k * ({s} + {f}); schema area at region_size(k)"
        head[3:6] = [
            line[:-1] + ("+" if line.startswith("  +") else "| columns ... |")
            if not line.startswith("  +")
            else line + "-" * 13 + "+"
            for line in head[3:6]
        ]
        head += ["", *_columns(ir)]
    out = [*head, ""]
    out += _table(control, [(fd.offset, fd.size, "control", fd.name) for fd in control.fields])
    out.append("")
    out += _table(slot, _slot_rows(ir, slot, shm.request_offsets, shm.result_offsets))
    out.append("")
    out += _table(final, _slot_rows(ir, final, {}, shm.final_result_offsets))
    return out


def _columns(ir: SchemaIR) -> list[str]:
    """The column list of a column-layout region: env i's value of a column is at its start +
    i * its bytes per env; each column starts at the previous end rounded up to 64."""
    columns, _ = shm_columns(ir, 1)
    out = [
        "columns (each field of all k envs back to back; env i at start + i * bytes per env)",
        "  part      field                      bytes per env  start",
    ]
    previous = "C0(k)"
    for column in columns:
        name = f"{column.struct}.{column.field.name}"
        out.append(f"  {column.part:<8}  {name:<25}  {column.field.size:>13}  {previous}")
        previous = f"round_up(previous + k * {column.field.size}, {COLUMN_ALIGN})"
    out.append(f"  region_size(k) = round_up(end of the last column, {COLUMN_ALIGN})")
    return out


def _slot_rows(
    ir: SchemaIR, host: StructIR, request_offsets: dict[str, int], result_offsets: dict[str, int]
) -> list[tuple[int, int, str, str]]:
    """(offset, size, part, field) of every field of a slot or final area, the request and
    result areas expanded to their fields."""
    request = ir.structs[ir.env.request] if ir.env is not None else None
    result = ir.structs[ir.env.result] if ir.env is not None else None
    rows: list[tuple[int, int, str, str]] = []
    for fd in host.fields:
        if fd.kind == "struct" and fd.name == "request" and request is not None:
            rows += [(fd.offset + r.offset, r.size, "request", r.name) for r in request.fields]
        elif fd.kind == "struct" and fd.name == "result" and result is not None:
            rows += [(fd.offset + r.offset, r.size, "result", r.name) for r in result.fields]
        elif request_offsets.get(fd.name) == fd.offset:
            rows.append((fd.offset, fd.size, "request", fd.name))
        elif result_offsets.get(fd.name) == fd.offset:
            rows.append((fd.offset, fd.size, "result", fd.name))
        else:
            rows.append((fd.offset, fd.size, _PART_OF_WORD.get(fd.name, "control"), fd.name))
    return rows


def _table(struct: StructIR, rows: list[tuple[int, int, str, str]]) -> list[str]:
    out = [f"{struct.name} ({struct.size} bytes)", "  offset    size  part        field"]
    end = 0
    for offset, size, part, name in sorted(rows):
        if offset > end:
            out.append(f"  {end:>6} {offset - end:>7}  (padding)")
        out.append(f"  {offset:>6} {size:>7}  {part:<10}  {name}")
        end = max(end, offset + size)
    if struct.size > end:
        out.append(f"  {end:>6} {struct.size - end:>7}  (padding)")
    return out
