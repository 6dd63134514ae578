//! The device through wgpu: adapter, buffers, the products kernel and the
//! gated FFN around it (see the module docs of [`crate::gpu`]).

use std::sync::mpsc;

use wgpu::util::DeviceExt;

use crate::act::{ActElem, ActivationPrecision, LANES, Layout, QuantizedActs};
use crate::error::{Error, Result};
use crate::matrix::{MatData, Matrix};
use crate::threads::GatedAct;

/// The products kernel (`products`).
const SHADER: &str = include_str!("products.wgsl");

/// Rows per workgroup: the shader's `@workgroup_size(16, ROWS)`.
const ROWS_PER_GROUP: usize = 4;

/// The most workgroups along one dispatch dimension that WebGPU
/// guarantees: rows spread over two dimensions, activation vectors over one.
const GROUPS_PER_DIM_MAX: usize = 65_535;

/// What a GPU holds of a run: the device, its queue and the products
/// pipeline. Products are submitted and waited for one call at a time.
pub struct Device {
    device: wgpu::Device,
    queue: wgpu::Queue,
    pipeline: wgpu::ComputePipeline,
    bind_layout: wgpu::BindGroupLayout,
    /// The adapter's name and backend, as a start-up line shows it.
    name: String,
    /// The largest storage buffer one binding may see.
    binding_bytes_max: u64,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device").field("name", &self.name).finish_non_exhaustive()
    }
}

/// A q8 or q4 matrix on the device, its bytes the container's own.
#[derive(Debug)]
pub struct DeviceMatrix {
    rows: usize,
    cols: usize,
    group: usize,
    layout: Layout,
    /// The weight bytes, rows back to back, padded to whole words.
    qs: wgpu::Buffer,
    scales: wgpu::Buffer,
}

/// The uniform block of `products.wgsl`, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    rows: u32,
    cols: u32,
    group: u32,
    groups_per_row: u32,
    row_bytes: u32,
    blocks: u32,
    block_cols: u32,
    lane_cols: u32,
    q4: u32,
    pad: [u32; 3],
}

/// Quantized activation vectors on the device, for one layout.
struct DeviceActs {
    layout: Layout,
    n: usize,
    codes: wgpu::Buffer,
    lane_scales: wgpu::Buffer,
}

impl Device {
    /// The first GPU with compute shaders (a hardware one before a software
    /// one such as Mesa's lavapipe), or why there is none.
    pub fn new() -> Result<Self> {
        let backends = wgpu::Backends::VULKAN | wgpu::Backends::METAL | wgpu::Backends::DX12;
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
            backends,
            ..wgpu::InstanceDescriptor::new_without_display_handle()
        });
        let adapters = pollster::block_on(instance.enumerate_adapters(backends));
        let adapter = adapters
            .into_iter()
            .filter(|a| a.get_downlevel_capabilities().flags.contains(wgpu::DownlevelFlags::COMPUTE_SHADERS))
            .min_by_key(|a| a.get_info().device_type == wgpu::DeviceType::Cpu)
            .ok_or_else(|| Error::NoGpuAdapter {
                reason: "no Vulkan, Metal or DX12 adapter with compute shaders (a software one: Mesa's lavapipe, \
                         Debian's mesa-vulkan-drivers)"
                    .into(),
            })?;
        let info = adapter.get_info();
        let name = format!("{} ({:?}, {:?})", info.name, info.backend, info.device_type);
        // The adapter's own limits: the defaults' 128 MiB binding would keep
        // a model's larger matrices off the device.
        let limits = adapter.limits();
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("strata"),
            required_limits: limits.clone(),
            ..Default::default()
        }))
        .map_err(|e| Error::Gpu { reason: format!("{name}: {e}") })?;
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("products"),
            source: wgpu::ShaderSource::Wgsl(SHADER.into()),
        });
        let storage = |binding, read_only| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Storage { read_only },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        };
        let uniform = wgpu::BindGroupLayoutEntry {
            binding: 5,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Uniform,
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        };
        let bind_layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("products"),
            entries: &[
                storage(0, true),
                storage(1, true),
                storage(2, true),
                storage(3, true),
                storage(4, false),
                uniform,
            ],
        });
        let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("products"),
            bind_group_layouts: &[Some(&bind_layout)],
            ..Default::default()
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some("products"),
            layout: Some(&pipeline_layout),
            module: &module,
            entry_point: Some("products"),
            compilation_options: Default::default(),
            cache: None,
        });
        let binding_bytes_max = limits.max_storage_buffer_binding_size.min(limits.max_buffer_size);
        Ok(Self { device, queue, pipeline, bind_layout, name, binding_bytes_max })
    }

    /// The adapter: its name, backend and kind.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Uploads a q8 or q4 matrix whose group the integer path takes, as it
    /// is stored; anything else stays on the host ([`Error::GpuUnsupported`]).
    pub fn upload(&self, m: &Matrix<'_>) -> Result<DeviceMatrix> {
        let (layout, qs, scales, group): (Layout, &[u8], &[f32], usize) = match m.data {
            MatData::Q8 { qs, scales, group } if Layout::Q8.supports_group(group) => {
                (Layout::Q8, bytemuck::cast_slice(qs), scales, group)
            }
            MatData::Q4 { qs, scales, group } if Layout::Q4.supports_group(group) => (Layout::Q4, qs, scales, group),
            data => return Err(Error::GpuUnsupported { format: data.format().name(), group: data.group() }),
        };
        // The shader indexes in u32: every count must fit, and so must each
        // buffer within one binding.
        params(layout, m.rows, m.cols, group)?;
        let qs = self.storage_init("weights", &padded_words(qs))?;
        let scales = self.storage_init("scales", bytemuck::cast_slice(scales))?;
        Ok(DeviceMatrix { rows: m.rows, cols: m.cols, group, layout, qs, scales })
    }

    /// `ys[t] = W xs[t]` for the `n` inputs `xs` (`[n, cols]`), their
    /// codes quantized at `precision`: bit for bit the CPU's integer path.
    ///
    /// # Panics
    /// If `xs` is not `[n, cols]` or `ys` not `[n, rows]`, or the device
    /// fails (it is lost, or out of memory).
    pub fn matmul(&self, m: &DeviceMatrix, precision: ActivationPrecision, xs: &[f32], n: usize, ys: &mut [f32]) {
        assert_eq!(Some(xs.len()), n.checked_mul(m.cols), "device matmul: xs must be [n, cols]");
        assert_eq!(Some(ys.len()), n.checked_mul(m.rows), "device matmul: ys must be [n, rows]");
        if m.cols == 0 {
            // An empty sum: `xs` has no elements to chunk by token, so no
            // dispatch would write `ys`.
            ys.fill(0.0);
            return;
        }
        for (xs, ys) in token_chunks(xs, m.cols, ys, m.rows) {
            let n = xs.len() / m.cols.max(1);
            let acts = self.upload_acts(m.layout, precision, xs, n, m.cols);
            let mut encoder = self.device.create_command_encoder(&Default::default());
            let out = self.encode_products(&mut encoder, m, &acts);
            self.read_back(encoder, &mut [(&out, ys)]);
        }
    }

    /// The gated feed-forward block of one expert (or a dense MLP) on
    /// `[gate, up, down]`: gate and up in one submission, the activation
    /// `act` on the host, then down; bit for bit
    /// [`crate::Threads::gated_ffn`] where the CPU takes the integer path.
    ///
    /// # Panics
    /// As [`crate::Threads::gated_ffn`], and if the device fails.
    pub fn gated_ffn(
        &self,
        [gate, up, down]: [&DeviceMatrix; 3],
        act: GatedAct<'_>,
        precision: ActivationPrecision,
        xs: &[f32],
        n: usize,
        ys: &mut [f32],
    ) {
        let (inter, hidden) = (gate.rows, gate.cols);
        act.check(inter, hidden);
        assert!(up.rows == inter && up.cols == hidden, "expert_ffn: up must be shaped like gate");
        assert!(down.rows == hidden && down.cols == inter, "expert_ffn: down must be [hidden, inter]");
        assert_eq!(Some(xs.len()), n.checked_mul(hidden), "expert_ffn: xs must be [n, hidden]");
        assert_eq!(Some(ys.len()), n.checked_mul(hidden), "expert_ffn: ys must be [n, hidden]");
        for (xs, ys) in token_chunks(xs, hidden, ys, hidden) {
            let n = ys.len() / hidden.max(1);
            let mut g = vec![0.0f32; n * inter];
            let mut u = vec![0.0f32; n * inter];
            let x_gate = self.upload_acts(gate.layout, precision, xs, n, hidden);
            let x_up_own = (up.layout != gate.layout).then(|| self.upload_acts(up.layout, precision, xs, n, hidden));
            let mut encoder = self.device.create_command_encoder(&Default::default());
            let g_out = self.encode_products(&mut encoder, gate, &x_gate);
            let u_out = self.encode_products(&mut encoder, up, x_up_own.as_ref().unwrap_or(&x_gate));
            self.read_back(encoder, &mut [(&g_out, &mut g), (&u_out, &mut u)]);
            act.apply(0..inter, &mut g, &mut u);
            self.matmul(down, precision, &g, n, ys);
            act.add_down_bias(ys);
        }
    }

    /// `xs` (`[n, cols]`) quantized for `layout` by the CPU's quantizer, on
    /// the device in column order.
    fn upload_acts(
        &self,
        layout: Layout,
        precision: ActivationPrecision,
        xs: &[f32],
        n: usize,
        cols: usize,
    ) -> DeviceActs {
        let (codes, lane_scales) = match precision {
            ActivationPrecision::Int16 => column_codes(&QuantizedActs::<i16>::new(layout, xs, n, cols)),
            ActivationPrecision::Int8 => column_codes(&QuantizedActs::<i8>::new(layout, xs, n, cols)),
        };
        let expect = "activations within a binding: [n, cols] was checked against the device's limits";
        let codes = self.storage_init("codes", bytemuck::cast_slice(&codes)).expect(expect);
        let lane_scales = self.storage_init("lane scales", bytemuck::cast_slice(&lane_scales)).expect(expect);
        DeviceActs { layout, n, codes, lane_scales }
    }

    /// Records the products of `m` with `acts` into a new output buffer.
    fn encode_products(&self, encoder: &mut wgpu::CommandEncoder, m: &DeviceMatrix, acts: &DeviceActs) -> wgpu::Buffer {
        assert_eq!(m.layout, acts.layout, "activations quantized for another layout");
        let params = params(m.layout, m.rows, m.cols, m.group).expect("checked at upload");
        let params = self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("params"),
            contents: bytemuck::bytes_of(&params),
            usage: wgpu::BufferUsages::UNIFORM,
        });
        let out_bytes = (acts.n * m.rows * size_of::<f32>()).max(size_of::<f32>()) as u64;
        let out = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("products"),
            size: out_bytes,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let buffers = [&m.qs, &m.scales, &acts.codes, &acts.lane_scales, &out, &params];
        let entries: Vec<wgpu::BindGroupEntry<'_>> = buffers
            .iter()
            .enumerate()
            .map(|(binding, buffer)| wgpu::BindGroupEntry {
                binding: binding as u32,
                resource: buffer.as_entire_binding(),
            })
            .collect();
        let bind_group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("products"),
            layout: &self.bind_layout,
            entries: &entries,
        });
        let row_groups = m.rows.div_ceil(ROWS_PER_GROUP);
        if row_groups > 0 && acts.n > 0 {
            let x = row_groups.min(GROUPS_PER_DIM_MAX);
            let z = row_groups.div_ceil(x);
            assert!(z <= GROUPS_PER_DIM_MAX && acts.n <= GROUPS_PER_DIM_MAX, "dispatch within WebGPU's limits");
            let mut pass = encoder.begin_compute_pass(&Default::default());
            pass.set_pipeline(&self.pipeline);
            pass.set_bind_group(0, &bind_group, &[]);
            pass.dispatch_workgroups(x as u32, acts.n as u32, z as u32);
        }
        out
    }

    /// Submits `encoder` with copies of each output buffer, waits, and
    /// reads each into its destination.
    fn read_back(&self, mut encoder: wgpu::CommandEncoder, outputs: &mut [(&wgpu::Buffer, &mut [f32])]) {
        let total_bytes: usize = outputs.iter().map(|(_, dst)| size_of_val(*dst)).sum();
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("read back"),
            size: total_bytes.max(size_of::<f32>()) as u64,
            usage: wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::MAP_READ,
            mapped_at_creation: false,
        });
        let mut offset = 0u64;
        for (buffer, dst) in outputs.iter() {
            let bytes = size_of_val(*dst) as u64;
            if bytes > 0 {
                encoder.copy_buffer_to_buffer(buffer, 0, &staging, offset, bytes);
            }
            offset += bytes;
        }
        self.queue.submit([encoder.finish()]);
        let slice = staging.slice(..);
        let (sender, receiver) = mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |mapped| {
            // The receiver waits below; it cannot be gone.
            let _ = sender.send(mapped);
        });
        self.device.poll(wgpu::PollType::wait_indefinitely()).expect("the device finishes its work");
        receiver.recv().expect("the map callback ran").expect("the read-back buffer maps");
        {
            let mapped = slice.get_mapped_range().expect("mapped for reading above");
            let values: &[f32] = bytemuck::cast_slice(&mapped[..]);
            let mut at = 0;
            for (_, dst) in outputs.iter_mut() {
                dst.copy_from_slice(&values[at..at + dst.len()]);
                at += dst.len();
            }
        }
        staging.unmap();
    }

    /// A read-only storage buffer holding `contents` (at least one word), if
    /// one binding may see it.
    fn storage_init(&self, what: &'static str, contents: &[u8]) -> Result<wgpu::Buffer> {
        let bytes = contents.len() as u64;
        if bytes > self.binding_bytes_max {
            return Err(Error::Gpu {
                reason: format!("{what}: {bytes} bytes, more than one binding of {} may hold", self.name),
            });
        }
        let word = [0u8; size_of::<u32>()];
        // wgpu gives no size of free VRAM (`--vram-budget auto` sets no cap):
        // a refused allocation is caught here, so that the matrix stays on
        // the host rather than the device being lost.
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buffer = self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some(what),
            contents: if contents.is_empty() { &word } else { contents },
            usage: wgpu::BufferUsages::STORAGE,
        });
        match pollster::block_on(scope.pop()) {
            None => Ok(buffer),
            Some(_) => Err(Error::GpuOutOfMemory { what, bytes }),
        }
    }
}

impl DeviceMatrix {
    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes this matrix holds on the device.
    pub fn bytes(&self) -> u64 {
        self.qs.size() + self.scales.size()
    }
}

/// The shader's parameters of a `[rows, cols]` matrix of `layout` with
/// `group` columns per scale, or why they do not fit its u32 indices.
fn params(layout: Layout, rows: usize, cols: usize, group: usize) -> Result<Params> {
    let too_large = || Error::Gpu { reason: format!("a [{rows}, {cols}] matrix is too large for 32-bit indices") };
    let row_bytes = match layout {
        Layout::Q8 => cols,
        Layout::Q4 => cols.div_ceil(2),
    };
    // Every index the shader forms stays below the weight bytes or the
    // codes of 65535 vectors (`token_chunks`), 4 bytes each.
    let blocks = cols.div_ceil(layout.block_cols());
    rows.checked_mul(row_bytes).filter(|&b| u32::try_from(b).is_ok()).ok_or_else(too_large)?;
    blocks
        .checked_mul(layout.block_cols())
        .and_then(|c| c.checked_mul(GROUPS_PER_DIM_MAX))
        .filter(|&c| u32::try_from(c).is_ok())
        .ok_or_else(too_large)?;
    let u = |v: usize| u32::try_from(v).map_err(|_| too_large());
    Ok(Params {
        rows: u(rows)?,
        cols: u(cols)?,
        group: u(group)?,
        groups_per_row: u(cols.div_ceil(group))?,
        row_bytes: u(row_bytes)?,
        blocks: u(blocks)?,
        block_cols: u(layout.block_cols())?,
        lane_cols: u(layout.lane_cols())?,
        q4: u32::from(layout == Layout::Q4),
        pad: [0; 3],
    })
}

/// The codes of `acts` in column order (each block's plane order undone),
/// one `i32` each, and their lane scales: what the shader reads.
fn column_codes<E: ActElem>(acts: &QuantizedActs<E>) -> (Vec<i32>, Vec<f32>) {
    let layout = acts.layout();
    let block = layout.block_cols();
    let mut codes = Vec::new();
    let mut lane_scales = Vec::new();
    for t in 0..acts.n() {
        let row = acts.row(t);
        for plane_order in row.q.chunks_exact(block) {
            codes.extend((0..block).map(|j| plane_order[layout.position::<E>(j)].into()));
        }
        debug_assert_eq!(row.lane_scales.len(), row.q.len() / block * LANES);
        lane_scales.extend_from_slice(row.lane_scales);
    }
    (codes, lane_scales)
}

/// `bytes` padded with zeros to whole 32-bit words.
fn padded_words(bytes: &[u8]) -> Vec<u8> {
    let mut words = bytes.to_vec();
    words.resize(bytes.len().next_multiple_of(size_of::<u32>()), 0);
    words
}

/// `xs` (`[n, x_cols]`) and `ys` (`[n, y_cols]`) in pieces of at most
/// [`GROUPS_PER_DIM_MAX`] vectors, one dispatch's worth.
fn token_chunks<'a>(
    xs: &'a [f32],
    x_cols: usize,
    ys: &'a mut [f32],
    y_cols: usize,
) -> impl Iterator<Item = (&'a [f32], &'a mut [f32])> {
    let (x_step, y_step) = (GROUPS_PER_DIM_MAX * x_cols.max(1), GROUPS_PER_DIM_MAX * y_cols.max(1));
    xs.chunks(x_step).zip(ys.chunks_mut(y_step))
}
