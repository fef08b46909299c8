"""keras-lars-plan's text reports of a plan (its settings, config.PlanSettings):
the assumptions, the model, the cluster, the memory, the step split and the
time to train; a run in phases one row a phase; the batch x devices table;
with --layers the per-layer data- vs model-parallel bytes and the pipeline
estimate. The records table: records_table.py."""

from keras_lars.phases import parse_phases
from keras_lars.tools.plan.cost_models import GB
from keras_lars.tools.plan.device import DTYPE_BYTES
from keras_lars.tools.plan.pipeline_parallel import pipeline_candidates
from keras_lars.tools.plan.step import layer_choices


def duration(seconds):
    """'250 ms', '4.2 s', '42 s', '12.5 min', '3.2 h' or '4.1 d'."""
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms"
    if seconds < 120:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.1f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _ms(seconds):
    return f"{seconds * 1e3:9.1f} ms"


def assumptions_text(options):
    """The output's first lines: what the defaults assume, and the flag that
    changes each."""
    spec = options.spec()
    utilization, half, fixed, source = options.device_settings()
    peak = options.peak_tflops or spec.peak(options.activation_dtype) / 1e12
    bandwidth = options.memory_bandwidth or spec.memory_bandwidth / GB
    if options.images_per_second:
        speed = f"{options.images_per_second:g} images/s measured (--images_per_second)"
    else:
        speed = (
            f"utilization {utilization:.3g} of the roofline, {source} (--utilization); "
            f"{fixed * 1e3:.2g} ms fixed a step (--fixed_step_ms), half speed at "
            f"{half:,.1f} images (--half_batch)"
        )
    epochs = f"{options.epochs:g}" if options.epochs else "keras_lars.resnet50_lars_recipe's"
    return "\n".join(
        [
            "assumes",
            f"  device        {options.device}: {peak:g} TFLOP/s in {options.activation_dtype}, "
            f"{bandwidth:g} GB/s, {options.capacity() / 1e9:.1f} GB (--device, "
            "--activation_dtype)",
            f"  speed         {speed}",
            f"  epochs        {epochs} (--epochs)",
            f"  all-reduce    {options.algorithm}, "
            f"{'overlapping' if options.overlap else 'after'} the backward pass (--overlap)",
            *_batch_assumptions(options),
        ]
    )


def _batch_assumptions(options):
    """The batch line (and under a schedule, the image size line)."""
    source = "--global_batch_size" if options.global_batch_size else "the default"
    if not options.schedule_flags():
        per_device = options.batch / options.devices
        return [
            f"  batch         {options.batch:,} = {options.devices} x {per_device:g} ({source})"
        ]
    batches, sizes = [options.batch], [options.image_size]
    if options.batch_schedule:
        batches, source = [value for _, value in parse_phases(options.batch_schedule)], None
    if options.image_size_schedule:
        sizes = [value for _, value in parse_phases(options.image_size_schedule)]
    per_device = " -> ".join(f"{batch // options.devices}" for batch in batches)
    return [
        f"  batch         {' -> '.join(f'{batch:,}' for batch in batches)} = "
        f"{options.devices} x {per_device} ({source or '--batch_schedule'})",
        f"  image size    {' -> '.join(map(str, sizes))} "
        f"({'--image_size_schedule' if options.image_size_schedule else '--image_size'})",
    ]


def memory_text(memory):
    """One line: the bytes a device holds and the verdict."""
    parts = ", ".join(
        f"{name} {getattr(memory, name) / 1e9:.1f}"
        for name in ("weights", "gradients", "slots", "activations")
    )
    return (
        f"memory    {memory.total / 1e9:.1f} GB of {memory.capacity / 1e9:.1f} GB a device: "
        f"{memory.verdict} ({parts} GB)"
    )


def model_text(options, image_size=None):
    """One line: parameters, gradient bytes, forward FLOPs (at `image_size`:
    said so)."""
    profile = options.profile(image_size)
    gradient_bytes = profile.parameters * DTYPE_BYTES[options.gradient_dtype]
    return (
        f"model     {profile.name}: {profile.parameters:,} parameters "
        f"({gradient_bytes / 1e6:.1f} MB of {options.gradient_dtype} gradients), "
        f"{profile.forward_flops / 1e9:.2f} GFLOPs forward per image"
        + (f" at {image_size}" if image_size else "")
    )


def cluster_text(options):
    cluster = options.cluster()
    return (
        f"cluster   {options.devices} devices = {cluster.nodes} "
        f"node{'s' if cluster.nodes > 1 else ''} x {cluster.devices_per_node}, "
        f"{options.algorithm} all-reduce, overlap {'on' if options.overlap else 'off'}"
    )


def plan_text(options):
    """The report of one plan: assumptions, model, memory, step split,
    efficiency, time to train."""
    run = options.run()
    step = run.step
    per_device = options.batch / options.devices
    lines = [
        assumptions_text(options),
        model_text(options),
        cluster_text(options),
        memory_text(options.memory()),
        f"step      batch {options.batch:,} ({per_device:g} a device)",
        f"  compute               {_ms(step.compute)}",
        f"  fixed                 {_ms(step.fixed)}",
        f"  communication         {_ms(step.communication)}  "
        f"(exposed {step.exposed_communication * 1e3:.1f} ms)",
        f"  input stall           {_ms(step.input)}",
        f"  step                  {_ms(step.step)}",
        f"scaling efficiency      {step.efficiency:9.1%}  (one device at {per_device:g} "
        "images: 100%)",
        f"steps                   {run.steps:9,}  ({run.epochs:g} epochs of "
        f"{options.examples:,} examples)",
        f"time to train           {duration(run.seconds):>9}",
    ]
    return "\n".join(lines)


PHASE_HEADER = (
    f"{'phase':<6}{'epochs':>8}{'batch':>9}{'a device':>10}{'image':>7}{'steps':>8}"
    f"{'compute ms':>12}{'exposed ms':>12}{'step ms':>9}{'efficiency':>12}{'time':>11}  memory"
)


def phased_text(options):
    """The report of a run in phases (tools/plan/phased_plan.py): assumptions,
    model, cluster, the all-reduce, one row a phase, the total."""
    plan = options.phased_plan()
    first = plan.phases[0].run.step
    sized = options.image_size if options.image_size_schedule else None
    lines = [
        assumptions_text(options),
        model_text(options, sized),
        cluster_text(options),
        f"all-reduce {first.communication * 1e3:.1f} ms a step in every phase (the same "
        "gradients); exposed ms: what the backward pass does not hide",
        PHASE_HEADER,
    ]
    for number, phase in enumerate(plan.phases, 1):
        span, step, memory = phase.span, phase.run.step, phase.memory
        lines.append(
            f"{number:>5} {f'{span.first_epoch}-{span.end_epoch:g}':>8}{span.global_batch:>9,}"
            f"{span.global_batch // options.devices:>10,}{span.image_size:>7}"
            f"{phase.run.steps:>8,}{step.compute * 1e3:>12.1f}"
            f"{step.exposed_communication * 1e3:>12.1f}{step.step * 1e3:>9.1f}"
            f"{step.efficiency:>12.1%}{duration(phase.run.seconds):>11}  "
            f"{memory.total / 1e9:.1f} GB {memory.verdict}"
        )
    lines += [
        f"{'total':<6}{f'0-{options.epochs:g}':>8}{'':>26}{plan.steps:>8,}{'':>45}"
        f"{duration(plan.seconds):>11}",
        f"time to train           {duration(plan.seconds):>9}  (the sum of the "
        f"{len(plan.phases)} phases)",
    ]
    return "\n".join(lines)


def report_text(options):
    """What keras-lars-plan prints (before --layout_out's lines): under a
    schedule the phased plan, else the plan, the batch x devices table and,
    with --layers, the per-layer report and the pipeline estimate."""
    if options.schedule_flags():
        return phased_text(options)
    parts = [plan_text(options), grid_text(options)]
    if options.layers:
        parts.append(layers_text(options))
    return "\n\n".join(parts)


def neighbourhood(value, factors=(0.25, 0.5, 1, 2, 4)):
    """`value` times each factor, rounded, at least 1."""
    return [max(1, round(value * f)) for f in factors]


def grid_text(options):
    """Time to train for batch x devices around the given point (epochs:
    --epochs, else the recipe's for each batch; '-' where a device would
    get less than one image, the devices do not divide the batch or do not
    fill whole nodes, 'mem'
    where a device's images do not fit its memory)."""
    batches = neighbourhood(options.batch)
    devices = neighbourhood(options.devices)
    epochs = f", {options.epochs:g} epochs" if options.epochs else ", the recipe's epochs"
    lines = [f"time to train, global batch (rows) x devices (columns){epochs}:"]
    lines.append(f"{'':>9}" + "".join(f"{d:>11,}" for d in devices))
    for batch in batches:
        cells = []
        for count in devices:
            nodes_ok = count % min(options.devices_per_node, count) == 0
            if batch < count or batch % count or batch > options.examples or not nodes_ok:
                cells.append(f"{'-':>11}")
            elif options.memory(batch, count).verdict == "does not fit":
                cells.append(f"{'mem':>11}")
            else:
                cells.append(f"{duration(options.run(batch, count).seconds):>11}")
        lines.append(f"{batch:>9,}" + "".join(cells))
    return "\n".join(lines)


def layers_text(options):
    """The per-layer report (bytes a step under data vs model parallelism)
    and the pipeline estimate."""
    profile = options.profile()
    choices = layer_choices(
        profile,
        options.batch,
        DTYPE_BYTES[options.gradient_dtype],
        DTYPE_BYTES[options.activation_dtype],
    )
    lines = [
        f"per layer, batch {options.batch:,}: data parallel = gradient "
        "all-reduce 2 P s_g; model parallel = activations in and their gradients back "
        "2 B I s_a (Krizhevsky 2014)",
        f"{'layer':<28}{'parameters':>12}{'data MB':>10}{'model MB':>11}"
        f"{'cheaper':>9}{'break-even batch':>18}",
    ]
    for c in choices:
        lines.append(
            f"{c.layer.name:<28}{c.layer.parameters:>12,}{c.data_parallel_bytes / 1e6:>10.1f}"
            f"{c.model_parallel_bytes / 1e6:>11.1f}{c.cheaper:>9}{c.break_even_batch:>18,.0f}"
        )
    return "\n".join(lines) + "\n\n" + pipeline_text(options)


def pipeline_text(options):
    """GPipe estimates against the data-parallel step, and the verdict."""
    data_parallel = options.run().step
    fits = options.memory().verdict != "does not fit"
    plans = pipeline_candidates(
        options.profile(),
        options.batch,
        options.device_model(),
        options.cluster(),
        {
            "gradient_bytes": DTYPE_BYTES[options.gradient_dtype],
            "overlap": options.overlap,
            "capacity": options.capacity(),
        },
    )
    lines = [
        "pipeline (GPipe, Huang et al. 2019): p stages x d replicas, m micro-batches, "
        "bubble (p-1)/(m+p-1)",
        f"{'stages':>7}{'replicas':>9}{'micro':>7}{'bubble':>8}{'step ms':>10}"
        f"{'memory GB':>11}  verdict",
        f"{'1':>7}{options.devices:>9}{'-':>7}{'-':>8}{data_parallel.step * 1e3:>10.1f}"
        f"{options.memory().total / 1e9:>11.1f}  data parallel, "
        f"{options.memory().verdict}",
    ]
    best = None
    for plan in plans:
        verdict = plan.memory.verdict
        lines.append(
            f"{plan.stages:>7}{plan.replicas:>9}{plan.micro_batches:>7}{plan.bubble:>8.1%}"
            f"{plan.step * 1e3:>10.1f}{plan.memory.total / 1e9:>11.1f}  {verdict}"
        )
        if verdict != "does not fit" and (best is None or plan.step < best.step):
            best = plan
    if best and (not fits or best.step < data_parallel.step):
        why = "data parallelism does not fit" if not fits else "faster"
        lines.append(
            f"a pipeline would beat data parallelism: {best.stages} stages x "
            f"{best.micro_batches} micro-batches ({why}: {best.step * 1e3:.1f} ms a step)"
        )
    else:
        lines.append(
            "data parallelism is the better layout here: no pipeline that fits is faster "
            f"than its {data_parallel.step * 1e3:.1f} ms a step"
        )
    return "\n".join(lines)
