//! Where a model runs: `--device cpu|gpu|cuda[:N]` and, on a GPU, `--vram-budget
//! SIZE|auto`, made into the models' [`DeviceRequest`].

use strata_models::DeviceRequest;
use strata_tier::ByteSize;

/// The device a model runs on (`--device`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceKind {
    /// Everything on the CPU.
    #[default]
    Cpu,
    /// The first GPU adapter (a build with `--features gpu`): the q8/q4
    /// matrices its kernels take, the rest on the CPU.
    Gpu,
    /// The NVIDIA GPU of ordinal `ordinal` (`cuda:N`, a build with
    /// `--features cuda`): opened through the driver, no kernel ported yet.
    Cuda { ordinal: usize },
}

impl DeviceKind {
    pub const ALL: [DeviceKind; 3] = [DeviceKind::Cpu, DeviceKind::Gpu, DeviceKind::Cuda { ordinal: 0 }];

    pub fn name(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Gpu => "gpu",
            DeviceKind::Cuda { .. } => "cuda",
        }
    }

    /// The models' request for this device within `vram_budget`, which
    /// only a GPU reads (`auto`: wgpu sets no cap, CUDA shares the free
    /// memory less a reserve).
    pub fn request(self, vram_budget: VramBudget) -> DeviceRequest {
        match self {
            DeviceKind::Cpu => DeviceRequest::Cpu,
            DeviceKind::Gpu => DeviceRequest::Gpu { vram_budget_bytes: vram_budget.bytes() },
            DeviceKind::Cuda { ordinal } => DeviceRequest::Cuda { ordinal, vram_budget_bytes: vram_budget.bytes() },
        }
    }
}

impl std::fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceKind::Cuda { ordinal } if *ordinal > 0 => write!(f, "cuda:{ordinal}"),
            _ => f.write_str(self.name()),
        }
    }
}

impl std::str::FromStr for DeviceKind {
    type Err = String;

    fn from_str(text: &str) -> std::result::Result<Self, String> {
        let wanted = text.trim().to_ascii_lowercase();
        let unknown = || format!("unknown device {text:?} (expected cpu, gpu, cuda or cuda:N)");
        if let Some(ordinal) = wanted.strip_prefix("cuda:") {
            return ordinal.parse().map(|ordinal| DeviceKind::Cuda { ordinal }).map_err(|_| unknown());
        }
        DeviceKind::ALL.into_iter().find(|d| d.name() == wanted).ok_or_else(unknown)
    }
}

/// The most bytes of matrices a GPU holds (`--vram-budget`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum VramBudget {
    /// Every matrix the device's kernels take: wgpu reports no free VRAM
    /// portably, so there is no share of it to take.
    #[default]
    Auto,
    Bytes(u64),
}

impl VramBudget {
    /// The cap in bytes (`None`: no cap).
    pub fn bytes(self) -> Option<u64> {
        match self {
            VramBudget::Auto => None,
            VramBudget::Bytes(bytes) => Some(bytes),
        }
    }
}

impl std::str::FromStr for VramBudget {
    type Err = String;

    fn from_str(text: &str) -> std::result::Result<Self, String> {
        if text.trim().eq_ignore_ascii_case("auto") {
            return Ok(VramBudget::Auto);
        }
        text.parse::<ByteSize>().map(|size| VramBudget::Bytes(size.bytes())).map_err(|e| e.to_string())
    }
}

impl std::fmt::Display for VramBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            VramBudget::Auto => f.write_str("auto"),
            VramBudget::Bytes(bytes) => write!(f, "{}", ByteSize(*bytes)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_takes_its_vram_budget_and_the_cpu_ignores_it() {
        let budget: VramBudget = "16KiB".parse().expect("a size");
        assert_eq!(DeviceKind::Gpu.request(budget), DeviceRequest::Gpu { vram_budget_bytes: Some(16 << 10) });
        assert_eq!(DeviceKind::Gpu.request(VramBudget::Auto), DeviceRequest::Gpu { vram_budget_bytes: None });
        assert_eq!(DeviceKind::Cpu.request(budget), DeviceRequest::Cpu);
        assert_eq!(" AUTO ".parse::<VramBudget>(), Ok(VramBudget::Auto));
        assert!("lots".parse::<VramBudget>().is_err());
    }

    #[test]
    fn devices_parse_from_their_flag_names_and_cuda_takes_an_ordinal() {
        for device in DeviceKind::ALL {
            assert_eq!(device.name().parse::<DeviceKind>(), Ok(device));
        }
        assert_eq!("CUDA:1".parse::<DeviceKind>(), Ok(DeviceKind::Cuda { ordinal: 1 }));
        assert_eq!(DeviceKind::Cuda { ordinal: 1 }.to_string(), "cuda:1");
        assert!("cuda:-1".parse::<DeviceKind>().unwrap_err().contains("expected cpu, gpu, cuda or cuda:N"));
        assert!("metal".parse::<DeviceKind>().is_err());
    }
}
