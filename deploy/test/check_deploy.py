#!/usr/bin/env python3
"""Checks a rendered manifest (multi-document YAML) for Pod Security `restricted` and Sluice's
own deployment rules. Usage: check_deploy.py helm|kustomize FILE. Prints each violation as
`OBJECT: rule: why`; exit 0 when there is none, 1 otherwise.

Restricted (Pod Security Standards, v1.30+ `restricted`, which includes `baseline`): no host
namespaces, ports or hostPath, no privileged containers, allowed volume types only, runAsNonRoot
and runAsUser != 0, allowPrivilegeEscalation false, capabilities drop ALL and add at most
NET_BIND_SERVICE, seccomp RuntimeDefault or Localhost, safe sysctls, default procMount, allowed
SELinux types, AppArmor runtime/default or localhost.

Project rules: readOnlyRootFilesystem, automountServiceAccountToken false (true only with rbac.rules), no `:latest` (or
untagged) image, the admin port in a Service of its own that is never NodePort/LoadBalancer, a
StatefulSet (not a Deployment) when state is kept, probes (/healthz, /readyz) on the admin port
of a non-loopback admin.listen, container ports matching the config, a grace period longer than
preStop + shutdown_grace, SLUICE_THREADS from the CPU limit, a memory request at least
pipeline.memory_budget, the standard labels on every object and pod template, and the instance
label in every workload selector.
"""
import re
import sys

import yaml

WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}
STD_LABELS = [
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/component",
]
ALLOWED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                   "persistentVolumeClaim", "projected", "secret"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
                "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
                "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
                "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"}
SELINUX_TYPES = {None, "", "container_t", "container_init_t", "container_kvm_t",
                 "container_engine_t"}
DEFAULT_ADMIN = "127.0.0.1:7777"
DEFAULT_WEBHOOK = "0.0.0.0:12000"
# Source kinds that listen for HTTP, with their default address (the webhook's port, but sns).
LISTENERS = {k: DEFAULT_WEBHOOK for k in ("webhook", "github", "gitlab", "bitbucket", "bitbucket-server",
                                           "gerrit", "stripe", "slack", "standard-webhooks", "hmac")}
LISTENERS["sns"] = "0.0.0.0:12001"

problems = []


def bad(obj, rule, why):
    problems.append(f"{obj}: {rule}: {why}")


def ident(doc):
    return f"{doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"


def split_listen(addr):
    m = re.fullmatch(r"(.*):(\d+)", str(addr))
    if not m:
        return None, None
    return m.group(1), int(m.group(2))


def loopback(host):
    return host is not None and (host.startswith("127.") or host in ("[::1]", "localhost"))


def seconds(d):
    total, s = 0.0, re.sub(r"\s+", "", str(d))
    units = {"ms": 0.001, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600}
    parts = re.findall(r"(\d+)([a-z]+)", s)
    if not parts or "".join(n + u for n, u in parts) != s:
        return None
    for n, u in parts:
        if u not in units:
            return None
        total += int(n) * units[u]
    return total


def mib(q):
    """A Kubernetes memory quantity or a Sluice byte size → MiB."""
    s = str(q).replace(" ", "")
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([A-Za-z]*)", s)
    if not m:
        return None
    f = {"": 1, "B": 1, "k": 1e3, "K": 1e3, "KB": 1e3, "Ki": 1024, "KiB": 1024, "M": 1e6,
         "MB": 1e6, "Mi": 2**20, "MiB": 2**20, "G": 1e9, "GB": 1e9, "Gi": 2**30, "GiB": 2**30}
    if m.group(2) not in f:
        return None
    return float(m.group(1)) * f[m.group(2)] / 2**20


def cpu_cores(q):
    s = str(q)
    return float(s[:-1]) / 1000 if s.endswith("m") else float(s)


def check_labels(name, labels, flavour):
    labels = labels or {}
    want = STD_LABELS + (["helm.sh/chart"] if flavour == "helm" else [])
    missing = [k for k in want if not labels.get(k)]
    if missing:
        bad(name, "standard labels", "missing " + ", ".join(missing))
    want_managed = "Helm" if flavour == "helm" else "kustomize"
    if labels.get("app.kubernetes.io/managed-by") not in (None, want_managed):
        bad(name, "standard labels", f"managed-by is {labels.get('app.kubernetes.io/managed-by')}")


def containers_of(spec):
    for key in ("initContainers", "containers", "ephemeralContainers"):
        for c in spec.get(key) or []:
            yield key, c


def check_restricted(name, spec, annotations):
    for k in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(k):
            bad(name, "restricted", f"{k} is true")
    psc = spec.get("securityContext") or {}
    for v in spec.get("volumes") or []:
        kinds = [k for k in v if k != "name"]
        for k in kinds:
            if k not in ALLOWED_VOLUMES:
                bad(name, "restricted", f"volume {v.get('name')} has type {k}")
    for s in psc.get("sysctls") or []:
        if s.get("name") not in SAFE_SYSCTLS:
            bad(name, "restricted", f"unsafe sysctl {s.get('name')}")
    pod_nonroot = psc.get("runAsNonRoot") is True
    pod_seccomp = (psc.get("seccompProfile") or {}).get("type")
    if pod_seccomp not in (None, "RuntimeDefault", "Localhost"):
        bad(name, "restricted", f"pod seccompProfile {pod_seccomp}")
    if psc.get("runAsUser") == 0:
        bad(name, "restricted", "pod runAsUser 0")
    if (psc.get("seLinuxOptions") or {}).get("type") not in SELINUX_TYPES:
        bad(name, "restricted", "pod seLinuxOptions.type not allowed")
    if (psc.get("appArmorProfile") or {}).get("type") not in (None, "RuntimeDefault", "Localhost"):
        bad(name, "restricted", "pod appArmorProfile not allowed")
    for k, v in (annotations or {}).items():
        if k.startswith("container.apparmor.security.beta.kubernetes.io/") and \
                not (v == "runtime/default" or v.startswith("localhost/")):
            bad(name, "restricted", f"AppArmor annotation {k}={v}")
    for key, c in containers_of(spec):
        cn = f"{name} {key}[{c.get('name')}]"
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            bad(cn, "restricted", "privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            bad(cn, "restricted", "allowPrivilegeEscalation is not false")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            bad(cn, "restricted", "capabilities.drop does not contain ALL")
        extra = [a for a in caps.get("add") or [] if a != "NET_BIND_SERVICE"]
        if extra:
            bad(cn, "restricted", f"capabilities.add {extra}")
        if sc.get("runAsNonRoot") is False or not (pod_nonroot or sc.get("runAsNonRoot") is True):
            bad(cn, "restricted", "runAsNonRoot is not true (pod or container)")
        if sc.get("runAsUser") == 0:
            bad(cn, "restricted", "runAsUser 0")
        seccomp = (sc.get("seccompProfile") or {}).get("type")
        if seccomp not in (None, "RuntimeDefault", "Localhost") or (seccomp is None and pod_seccomp is None):
            bad(cn, "restricted", "seccompProfile is not RuntimeDefault or Localhost (pod or container)")
        if sc.get("procMount") not in (None, "Default"):
            bad(cn, "restricted", "procMount not Default")
        if (sc.get("seLinuxOptions") or {}).get("type") not in SELINUX_TYPES:
            bad(cn, "restricted", "seLinuxOptions.type not allowed")
        if (sc.get("appArmorProfile") or {}).get("type") not in (None, "RuntimeDefault", "Localhost"):
            bad(cn, "restricted", "appArmorProfile not allowed")
        for p in c.get("ports") or []:
            if p.get("hostPort"):
                bad(cn, "restricted", f"hostPort {p.get('hostPort')}")
        # project rules for every container
        if sc.get("readOnlyRootFilesystem") is not True:
            bad(cn, "readOnlyRootFilesystem", "not true")
        image = str(c.get("image", ""))
        last = image.rsplit("/", 1)[-1]
        if "@" not in image and (":" not in last or last.endswith(":latest")):
            bad(cn, "image tag", f"{image!r} is :latest or untagged")


def sluice_config(spec, configmaps):
    for v in spec.get("volumes") or []:
        if v.get("name") == "config" and "configMap" in v:
            cm = configmaps.get(v["configMap"].get("name"))
            if cm is None:
                return None, f"ConfigMap {v['configMap'].get('name')} is not in the render"
            text = (cm.get("data") or {}).get("sluice.yaml")
            if text is None:
                return None, "ConfigMap has no sluice.yaml"
            return yaml.safe_load(text) or {}, None
    return None, "no volume named config from a ConfigMap"


def resolve_port(c, port):
    if isinstance(port, int):
        return port
    for p in c.get("ports") or []:
        if p.get("name") == port:
            return p.get("containerPort")
    return None


def check_sluice(name, doc, spec, configmaps):
    found = [(k, c) for k, c in containers_of(spec) if c.get("name") == "sluice"]
    if len(found) != 1:
        bad(name, "sluice container", f"expected one container named sluice, found {len(found)}")
        return
    key, c = found[0]
    if key == "initContainers" and c.get("restartPolicy") != "Always":
        bad(name, "native sidecar", "sluice in initContainers without restartPolicy: Always")
    if key == "initContainers" and not spec.get("containers"):
        bad(name, "native sidecar", "no app container next to the sidecar")
    cfg, err = sluice_config(spec, configmaps)
    if cfg is None:
        bad(name, "config", err)
        return
    admin = cfg.get("admin") or {}
    admin_on = admin.get("enabled", True) is not False
    host, aport = split_listen(admin.get("listen", DEFAULT_ADMIN))
    # probes
    probes = {"livenessProbe": "/healthz", "readinessProbe": "/readyz"}
    for probe, path in probes.items():
        p = c.get(probe)
        if p is None:
            bad(name, "probes", f"no {probe}")
            continue
        hg = p.get("httpGet") or {}
        if hg.get("path") != path:
            bad(name, "probes", f"{probe} path is {hg.get('path')}, not {path}")
        if not admin_on:
            bad(name, "probes", f"{probe} but admin.enabled is false")
            continue
        target = resolve_port(c, hg.get("port"))
        if target != aport:
            bad(name, "probes", f"{probe} port {hg.get('port')} → {target}, admin.listen port is {aport}")
        if loopback(host):
            bad(name, "probes", f"{probe} on admin.listen {admin.get('listen', DEFAULT_ADMIN)}: loopback, the kubelet cannot reach it")
    # ports derived from the config
    want = set()
    for src in (cfg.get("sources") or {}).values():
        kind = (src or {}).get("kind")
        if kind in LISTENERS:
            h, p = split_listen(src.get("listen", LISTENERS[kind]))
            if not loopback(h):
                want.add(p)
    if admin_on and not loopback(host):
        want.add(aport)
    have = {p.get("containerPort") for p in c.get("ports") or []}
    if have != want:
        bad(name, "container ports", f"{sorted(have)} but the config listens on {sorted(want)}")
    # state
    state_dir = cfg.get("state_dir")
    mounts = {m.get("mountPath"): m.get("name") for m in c.get("volumeMounts") or []}
    claims = {t["metadata"]["name"] for t in doc["spec"].get("volumeClaimTemplates") or []}
    for t in doc["spec"].get("volumeClaimTemplates") or []:
        moving = [k for k in (t["metadata"].get("labels") or {})
                  if k in ("app.kubernetes.io/version", "helm.sh/chart")]
        if moving:
            bad(name, "state", f"volumeClaimTemplates (immutable) carry changing labels {moving}: an upgrade would fail")
    pvc_vols = {v["name"] for v in spec.get("volumes") or [] if "persistentVolumeClaim" in v}
    if doc["kind"] == "Deployment" and (state_dir or pvc_vols):
        bad(name, "state", f"a Deployment with state (state_dir {state_dir}, PVC volumes {sorted(pvc_vols)}): use a StatefulSet with volumeClaimTemplates")
    if doc["kind"] == "StatefulSet" and state_dir and mounts.get(state_dir) not in claims:
        bad(name, "state", f"state_dir {state_dir} is not a volumeClaimTemplate mount")
    if claims and not state_dir:
        bad(name, "state", "volumeClaimTemplates but no state_dir in the config")
    # shutdown
    grace = seconds(cfg.get("shutdown_grace", "30s"))
    pre = (((c.get("lifecycle") or {}).get("preStop") or {}).get("sleep") or {}).get("seconds", 0)
    tgps = spec.get("terminationGracePeriodSeconds", 30)
    if grace is None:
        bad(name, "termination", f"cannot read shutdown_grace {cfg.get('shutdown_grace')!r}")
    elif tgps <= pre + grace:
        bad(name, "termination", f"terminationGracePeriodSeconds {tgps} <= preStop {pre} + shutdown_grace {grace:g}")
    if key == "containers" and not pre:
        bad(name, "termination", "no preStop sleep before SIGTERM (endpoint removal races the drain)")
    pre_hook = ((c.get("lifecycle") or {}).get("preStop") or {})
    if "exec" in pre_hook:
        bad(name, "termination", "preStop exec: the image is distroless (no shell, no sleep)")
    # threads and resources
    res = c.get("resources") or {}
    env = {e.get("name"): e for e in c.get("env") or []}
    t = env.get("SLUICE_THREADS")
    ref = ((t or {}).get("valueFrom") or {}).get("resourceFieldRef") or {}
    if not (ref.get("resource") == "limits.cpu" and str(ref.get("divisor", "1")) == "1"):
        bad(name, "threads", "SLUICE_THREADS is not resourceFieldRef limits.cpu (divisor 1)")
    if "cpu" not in (res.get("limits") or {}):
        bad(name, "threads", "no CPU limit: SLUICE_THREADS would be the node's cores")
    budget = mib((cfg.get("pipeline") or {}).get("memory_budget", "256MiB"))
    req = mib((res.get("requests") or {}).get("memory", "0"))
    lim = mib((res.get("limits") or {}).get("memory", "0"))
    if budget is None or req is None or req < budget:
        bad(name, "memory", f"request {res.get('requests', {}).get('memory')} below pipeline.memory_budget")
    if lim is None or (lim and req and lim < req):
        bad(name, "memory", "limit below request")
    return aport if admin_on and not loopback(host) else None


def main():
    flavour, path = sys.argv[1], sys.argv[2]
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    configmaps = {d["metadata"]["name"]: d for d in docs if d.get("kind") == "ConfigMap"}
    services = [d for d in docs if d.get("kind") == "Service"]
    admin_ports = []
    workloads = 0
    for d in docs:
        name = ident(d)
        check_labels(name, (d.get("metadata") or {}).get("labels"), flavour)
        if d.get("kind") not in WORKLOADS:
            continue
        workloads += 1
        tmpl = d["spec"]["template"]
        check_labels(name + " pod template", (tmpl.get("metadata") or {}).get("labels"), flavour)
        spec = tmpl["spec"]
        # The token only where the render grants Kubernetes permissions (rbac.rules).
        grants = any(x.get("kind") in ("RoleBinding", "ClusterRoleBinding") for x in docs)
        if spec.get("automountServiceAccountToken") is not grants:
            bad(name, "automountServiceAccountToken", "mounted without rbac.rules" if not grants else "not mounted although rbac.rules grant permissions")
        sel = (d["spec"].get("selector") or {}).get("matchLabels") or {}
        if "app.kubernetes.io/instance" not in sel:
            bad(name, "selector", "no app.kubernetes.io/instance in the selector (two instances in a namespace would share pods)")
        check_restricted(name, spec, (tmpl.get("metadata") or {}).get("annotations"))
        admin_ports.append(check_sluice(name, d, spec, configmaps))
    if workloads == 0:
        bad(path, "workload", "no Deployment or StatefulSet rendered")
    for s in services:
        name = ident(s)
        spec = s.get("spec") or {}
        ports = spec.get("ports") or []
        is_admin = [p for p in ports if p.get("name") == "admin" or p.get("targetPort") == "admin"]
        if not is_admin:
            continue
        if spec.get("type", "ClusterIP") != "ClusterIP":
            bad(name, "admin Service", f"admin port in a {spec.get('type')} Service")
        if spec.get("clusterIP") != "None" and len(is_admin) != len(ports):
            bad(name, "admin Service", "admin port shares a Service with other ports")
    for ap in admin_ports:
        if ap and not any(p.get("name") == "admin" for s in services
                          if (s.get("spec") or {}).get("clusterIP") != "None"
                          for p in (s.get("spec") or {}).get("ports") or []):
            bad(path, "admin Service", "no Service of its own for the admin port")
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
