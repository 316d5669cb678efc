"""What one Ascend host says about its devices: device nodes, NIC addresses, super-pod ids.

Sources, each as the real tools and files present them:

* ``/dev/davinciN`` (N up to 15): one node per physical device. A container sees only the nodes
  of its devices, under their physical numbers.
* ``hccn_tool -i N -ip -g``: prints ``ipaddr:A.B.C.D`` then ``netmask:...`` for device N.
* ``/etc/hccn.conf``: ``address_N=IP``, ``netmask_N=MASK``, ``netdetect_N=...`` lines.
* ``npu-smi info -m``: a table ``NPU ID | Chip ID | Chip Logic ID | Chip Phy-ID | Chip Name``
  (A3; columns padded with spaces, ``-`` and ``Mcu`` for the management chip), read by
  ``rank_tables.host_devices`` (the one model of a host's devices that the card checks and
  ``--bind-cores auto`` read too).
* ``npu-smi info -t spod-info -i NPU -c CHIP``: ``SDID : ...``, ``Super Pod ID : ...`` lines.

Nothing here runs at import time; every probe is a method of ``AscendHost``.
"""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Mapping, Optional, Sequence

from parallel.contract import shown
from rank_tables.bounded import MAX_DEVICE_ID, MAX_FILE_BYTES, UnreadableFile, read_text, whole_number
from rank_tables.errors import TableInputError
from rank_tables.host_devices import TOOL_DIRS
from rank_tables.host_devices import parse_chip_map as read_chip_map

"""Where to look for ``davinciN`` device nodes instead of ``/dev`` (tests use plain files)."""
DEFAULT_DEVFS = Path("/dev")
DEFAULT_HCCN_CONF = Path("/etc/hccn.conf")
ASCEND_TOOL_DIR = "/usr/local/Ascend/driver/tools"
"""Where the driver installs ``hccn_tool``; often not on ``PATH``."""
DEFAULT_TOOL_PATH = os.pathsep.join(TOOL_DIRS)
"""``/usr/local/sbin`` (where hosts and container recipes put ``npu-smi``), then the driver's
tool folder; callers put ``PATH`` first (``rank_tables.host_devices.tool_path``)."""
TOOL_TIMEOUT_S = 30.0

_DAVINCI = re.compile(r"davinci([0-9]{1,2})")
_HCCN_ADDRESS = re.compile(r"\s*address_([0-9]+)\s*=\s*(\S+)\s*")
_IPADDR_LINE = re.compile(r"\s*ipaddr\s*:\s*(\S+)\s*")
_KEY_VALUE = re.compile(r"\s*([^:]+?)\s*:\s*(.*?)\s*")


@dataclasses.dataclass(frozen=True)
class DeviceIp:
    """A device's NIC address and where it came from (for the report to the user)."""

    ip: str
    source: str


@dataclasses.dataclass(frozen=True)
class SuperPodInfo:
    """``npu-smi info -t spod-info`` for one device."""

    super_device_id: int
    super_pod_id: str


@dataclasses.dataclass(frozen=True)
class AscendHost:
    """This host's devices and tools: ``devfs`` holds the device nodes, ``tool_path`` is searched
    like ``PATH`` for ``hccn_tool`` and ``npu-smi``, ``hccn_conf`` is read when ``hccn_tool``
    gives no address."""

    devfs: Path = DEFAULT_DEVFS
    tool_path: str = DEFAULT_TOOL_PATH
    hccn_conf: Path = DEFAULT_HCCN_CONF

    def devices(self) -> tuple[int, ...]:
        """Physical ids of the ``davinciN`` nodes under ``devfs``, ascending."""
        try:
            names = [p.name for p in self.devfs.iterdir()]
        except OSError:
            return ()
        return tuple(sorted(int(m.group(1)) for m in map(_DAVINCI.fullmatch, names) if m))

    def tool(self, name: str) -> Optional[str]:
        """The full path of tool ``name`` on ``tool_path``, if there is one."""
        return shutil.which(name, path=self.tool_path)

    def device_ips(self, devices: Sequence[int], by_hand: Mapping[int, str]) -> dict[int, DeviceIp]:
        """The NIC address of each physical device: given by hand, else ``hccn_tool``, else
        ``hccn.conf``. Raises ``TableInputError`` naming each device left without one and why."""
        found = {d: DeviceIp(ip, "--device-ip") for d, ip in by_hand.items() if d in devices}
        missing = [d for d in devices if d not in found]
        found.update(self._from_hccn_tool(missing))
        missing = [d for d in missing if d not in found]
        conf = read_hccn_conf(self.hccn_conf)
        found.update({d: DeviceIp(conf[d], str(self.hccn_conf)) for d in missing if d in conf})
        missing = [d for d in missing if d not in found]
        if missing:
            raise TableInputError(self._no_ip_message(missing))
        return {d: found[d] for d in devices}

    def _from_hccn_tool(self, devices: Sequence[int]) -> dict[int, DeviceIp]:
        tool = self.tool("hccn_tool")
        if tool is None or not devices:
            return {}
        ips = {d: hccn_tool_ip(tool, d) for d in devices}
        return {d: DeviceIp(ip, "hccn_tool") for d, ip in ips.items() if ip is not None}

    def _no_ip_message(self, missing: Sequence[int]) -> str:
        ids = ",".join(map(str, missing))
        tool = "hccn_tool gave no 'ipaddr:'" if self.tool("hccn_tool") else "no hccn_tool on the tool path"
        return (f"no device IP for device(s) {ids}: {tool} and {self.hccn_conf} has no address_N for them; "
                "pass --device-ip N=IP for each")

    def super_pod_info(self, devices: Sequence[int]) -> dict[int, SuperPodInfo]:
        """``SDID`` and ``Super Pod ID`` of each physical device, from ``npu-smi``."""
        npu_smi = self.tool("npu-smi")
        if npu_smi is None:
            raise TableInputError("no npu-smi on the tool path to read super device ids; "
                              "pass --super-device-id N=SDID for each device and --super-pod-id")
        chips = parse_chip_map(_run([npu_smi, "info", "-m"]))
        unknown = [d for d in devices if d not in chips]
        if unknown:
            raise TableInputError(f"npu-smi info -m lists no chip with Chip Phy-ID {','.join(map(str, unknown))}")
        return {d: parse_spod_info(_run([npu_smi, "info", "-t", "spod-info", "-i", str(chips[d][0]),
                                         "-c", str(chips[d][1])])) for d in devices}


def hccn_tool_ip(tool: str, device: int) -> Optional[str]:
    """The address ``hccn_tool -i DEVICE -ip -g`` prints, ``None`` if it fails or prints none."""
    try:
        done = subprocess.run([tool, "-i", str(device), "-ip", "-g"], capture_output=True, text=True,
                              timeout=TOOL_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_hccn_tool_ip(done.stdout) if done.returncode == 0 else None


def parse_hccn_tool_ip(output: str) -> Optional[str]:
    """The address on the ``ipaddr:`` line of ``hccn_tool -i N -ip -g`` output."""
    for line in output.splitlines():
        match = _IPADDR_LINE.fullmatch(line)
        if match:
            return match.group(1)
    return None


def read_hccn_conf(path: Path) -> dict[int, str]:
    """``address_N`` entries of an ``hccn.conf``; a missing file has none. The file is read
    within ``MAX_FILE_BYTES`` (a copy given by hand may be anything, ``/dev/zero`` included)."""
    if not os.path.lexists(path):
        return {}
    try:
        return parse_hccn_conf(read_text(path, MAX_FILE_BYTES, "hccn.conf"))
    except UnreadableFile as exc:
        raise TableInputError(exc.message) from None


def parse_hccn_conf(text: str) -> dict[int, str]:
    """Device id -> address from ``address_N=IP`` lines; other keys are ignored."""
    found: dict[int, str] = {}
    for line in text.splitlines():
        match = _HCCN_ADDRESS.fullmatch(line)
        device = whole_number(match.group(1)) if match else None
        if match and device is not None and device <= MAX_DEVICE_ID:
            found[device] = match.group(2)
    return found


def parse_chip_map(output: str) -> dict[int, tuple[int, int]]:
    """Chip Phy-ID -> (NPU ID, Chip ID) from ``npu-smi info -m``, skipping ``Mcu`` rows."""
    header = next((line for line in output.splitlines() if "NPU ID" in line), None)
    if header is None:
        raise TableInputError("npu-smi info -m printed no 'NPU ID' header")
    if "Chip Phy-ID" not in header:
        raise TableInputError("npu-smi info -m has no 'Chip Phy-ID' column (not an Atlas A3 host?); "
                          "pass --super-device-id N=SDID and --super-pod-id")
    return {device: (die.npu, die.chip) for device, die in read_chip_map(output).items()}


def parse_spod_info(output: str) -> SuperPodInfo:
    """``SDID`` and ``Super Pod ID`` from ``npu-smi info -t spod-info`` output."""
    fields = {m.group(1): m.group(2) for m in map(_KEY_VALUE.fullmatch, output.splitlines()) if m}
    sdid, pod = whole_number(fields.get("SDID", "")), fields.get("Super Pod ID", "")
    if sdid is None or not pod:
        raise TableInputError(f"npu-smi spod-info printed no SDID / Super Pod ID: {shown(output.strip())}")
    return SuperPodInfo(sdid, pod)


def this_host_ip() -> str:
    """This host's IP as other hosts reach it (``hccl_tools.py``'s default ``server_id``), without
    its fault: a hostname resolving to a loopback address is an error, not a server id."""
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, family=socket.AF_INET)
    except OSError as exc:
        raise TableInputError(f"cannot resolve this host's name to an IP ({exc}); pass --server-id") from None
    addresses = [str(info[4][0]) for info in infos if not str(info[4][0]).startswith("127.")]
    if not addresses:
        raise TableInputError(f"this host's name {socket.gethostname()!r} resolves only to loopback; pass --server-id")
    return addresses[0]


def _run(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TableInputError(f"{' '.join(argv)}: {exc}") from None
    if done.returncode != 0:
        raise TableInputError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()[:200]}")
    return done.stdout
