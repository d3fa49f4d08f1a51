#!/usr/bin/env python3
# SPDX-License-Identifier: MIT OR Apache-2.0
"""Rewrites NCCL's topology dump so that NICs with no PCI path can be fused.

    topo_fuse.py DUMP.xml OUT.xml soft0 soft1 [...]

Why: a net device whose plugin reports no PCI path (ibnet's soft devices, any virtual NIC)
is hung by NCCL's topology detection (graph/xml.cc, ncclTopoFillNet) under the first CPU's
one `<nic>`, all such devices in the same `<nic>`. NCCL then auto-fuses them (they look like
ports of one NIC) or, with NCCL_NET_FORCE_MERGE, fuses them itself; either way the vNIC's
parent (graph/topo.cc, ncclTopoGetVNicParent) is that `<nic>`, a parent it has no rule
for, so the vNIC hangs under a `<nic>` that nothing links to the GPU: "Could not find any
local path from gpu 0 to net" and the communicator fails.

What: each named `<net>` that hangs in a `<nic>` right under a `<cpu>` is moved into a
`<nic>` of its own, inside a made-up PCI NIC under the same CPU:

    <pci busid="0000:e0:00.0" class="0x020000" vendor="0x0000" device="0x0000"
         subsystem_vendor="0x0000" subsystem_device="0x0000" link_speed="16.0 GT/s PCIe"
         link_width="16">
      <nic>
        <net name="soft0" .../>
      </nic>
    </pci>

(one bus number per device, from 0xe0 up, skipping any bus the dump uses), and a `<nic>` left
empty is dropped. With this file in NCCL_TOPO_FILE, the devices' common parent is the CPU,
which NCCL handles by making a PCI parent for the vNIC, so `NCCL_NET_FORCE_MERGE=soft0,soft1`
gives a fused device NCCL uses ("via NET/IBNet/2").

The file is written the way NCCL writes its dump (two-space indent, attributes in their
order, `<tag .../>`): NCCL's own XML reader is not a full XML parser. Exit status: 0 written,
1 a named device is missing or not under a CPU's `<nic>`, 2 unreadable dump.
"""

import re
import sys
import xml.etree.ElementTree as ET

FIRST_BUS = 0xE0
PCI_ATTRS = (("class", "0x020000"), ("vendor", "0x0000"), ("device", "0x0000"),
             ("subsystem_vendor", "0x0000"), ("subsystem_device", "0x0000"),
             ("link_speed", "16.0 GT/s PCIe"), ("link_width", "16"))
BUSID = re.compile(r"^[0-9a-fA-F]{4}:([0-9a-fA-F]{2}):")


def parents(root):
    """child -> parent for every element of the tree."""
    return {c: p for p in root.iter() for c in p}


def used_buses(root):
    """PCI bus numbers that the dump's busids use."""
    out = set()
    for e in root.iter("pci"):
        m = BUSID.match(e.get("busid", ""))
        if m:
            out.add(int(m.group(1), 16))
    return out


def fuse_ready(root, names):
    """Moves each named net under its own made-up PCI NIC (see the module doc). Returns a
    list of what was done, one line per device; raises ValueError naming what is wrong."""
    up = parents(root)
    nets = {e.get("name"): e for e in root.iter("net")}
    missing = [n for n in names if n not in nets]
    if missing:
        raise ValueError(f"no <net name=...> for {', '.join(missing)} in the dump "
                         f"(it has: {', '.join(sorted(k for k in nets if k)) or 'none'})")
    taken = used_buses(root)
    bus = FIRST_BUS
    done = []
    for name in names:
        net = nets[name]
        nic = up.get(net)
        cpu = up.get(nic) if nic is not None else None
        if nic is None or nic.tag != "nic" or cpu is None:
            raise ValueError(f"{name}: not inside a <nic>")
        if cpu.tag != "cpu":
            done.append(f"{name}: already under <{cpu.tag} busid={cpu.get('busid', '?')}>, left as it is")
            continue
        while bus in taken:
            bus += 1
        if bus > 0xFF:
            raise ValueError("no free PCI bus number left for a made-up NIC")
        taken.add(bus)
        busid = f"0000:{bus:02x}:00.0"
        nic.remove(net)
        if len(nic) == 0:
            cpu.remove(nic)
        pci = ET.SubElement(cpu, "pci", {"busid": busid, **dict(PCI_ATTRS)})
        ET.SubElement(pci, "nic").append(net)
        done.append(f"{name}: moved under a made-up PCI NIC {busid} of cpu numaid={cpu.get('numaid', '?')}")
    return done


def dump(elem, indent=0):
    """The element as NCCL's ncclTopoDumpXmlRec writes it."""
    pad = " " * indent
    attrs = "".join(f' {k}="{v}"' for k, v in elem.attrib.items())
    if len(elem) == 0:
        return f"{pad}<{elem.tag}{attrs}/>\n"
    inner = "".join(dump(c, indent + 2) for c in elem)
    return f"{pad}<{elem.tag}{attrs}>\n{inner}{pad}</{elem.tag}>\n"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 3:
        print("usage: topo_fuse.py DUMP.xml OUT.xml NET [NET...]", file=sys.stderr)
        return 2
    src, out, names = argv[0], argv[1], argv[2:]
    try:
        root = ET.parse(src).getroot()
    except (OSError, ET.ParseError) as e:
        print(f"topo_fuse: cannot read {src}: {e}", file=sys.stderr)
        return 2
    try:
        done = fuse_ready(root, names)
    except ValueError as e:
        print(f"topo_fuse: {e}", file=sys.stderr)
        return 1
    with open(out, "w") as f:
        f.write(dump(root))
    for line in done:
        print(f"topo_fuse: {line}")
    print(f"topo_fuse: wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
